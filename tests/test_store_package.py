"""`export --format package`: the winners, installable into the unmodified model anywhere."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from store import open_reader
from store.export import export
from tests.test_list_sites_cli import ROOT, run_cli

USE = '''
import json, sys
import torch
import kiln_kernels
from models_copy import make_mlp

model, (x,) = make_mlp()
fast = kiln_kernels.install(model)
with torch.no_grad():
    expected, actual = model(x), fast(x)
    other = torch.randn(3, 5, 32)  # a shape no kernel was proven on
    expected_other, actual_other = model(other), fast(other)
# The guard itself: a call on inputs the kernel was not proven for runs the site's own ops.
# The proven shapes with every stride doubled: a valid call of any site (a larger first
# dimension is not, where a weight's rows must match), and not the proven layout.
site = kiln_kernels.SITES[0]
guarded = kiln_kernels.kernels()[site["key"]]
args = [torch.randn([*p["shape"], 2])[..., 0] for p in site["proven"]]
with torch.no_grad():
    direct = (guarded(*args) - guarded.reference(*args)).abs().max().item()
print(json.dumps({
    "direct_diff": direct,
    "sites": [s["key"] for s in kiln_kernels.SITES],
    "max_diff": (expected - actual).abs().max().item(),
    "max_diff_other": (expected_other - actual_other).abs().max().item(),
    "stats": kiln_kernels.stats(),
    "kiln_importable": any(name == "core" or name.startswith("core.") for name in sys.modules),
}))
'''


@pytest.fixture(scope="module")
def searched_store(tmp_path_factory):
    folder = tmp_path_factory.mktemp("package")
    db = folder / "kiln.db"
    result = run_cli("tests.models:make_mlp", "--device", "cpu", "--db", str(db),
                     "--max-candidates", "6", "--workers", "1", "--trials", "2",
                     "--warmup", "0", "--out", str(folder / "out"), "--no-e2e")
    assert result.returncode == 0, result.stderr
    return db


def test_package_installs_into_the_unmodified_model_without_kiln(searched_store, tmp_path):
    # On the CPU the interpreter is slower than PyTorch: take every accepted kernel.
    written = export(open_reader(searched_store), "package", tmp_path, min_speedup=0.0)
    package = tmp_path / "kiln_kernels"
    assert package / "README.md" in written and (package / "sites.json").is_file()
    sites = json.loads((package / "sites.json").read_text())
    assert sites and all(s["proven"] for s in sites)
    shutil.copyfile(ROOT / "tests" / "models.py", tmp_path / "models_copy.py")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(PYTHONPATH=str(tmp_path), TRITON_INTERPRET="1")
    result = subprocess.run([sys.executable, "-c", USE], cwd=tmp_path, env=env,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert not report["kiln_importable"], "the package needed Kiln itself"
    assert report["max_diff"] < 1e-4 and report["max_diff_other"] < 1e-4
    # Each kernel ran once: on the first call. The other shape is another site to the
    # compiled model, so it ran PyTorch's ops; the guard caught the direct unproven call.
    kernel_calls = {k: v for k, v in report["stats"].items() if k.endswith(": kernel")}
    assert kernel_calls == {f"{key}: kernel": 1 for key in report["sites"]}
    assert report["stats"][f"{report['sites'][0]}: fallback (unproven call)"] == 1
    assert report["direct_diff"] == 0.0


def test_no_winner_is_a_clear_error(searched_store, tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "store", "--db", str(searched_store), "export", "--format",
         "package", "--out", str(tmp_path), "--min-speedup", "1000"],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
        env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert result.returncode == 2 and "faster than PyTorch" in result.stderr
    assert not (tmp_path / "kiln_kernels").exists()
