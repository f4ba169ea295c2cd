"""The package export on a machine without a GPU, and its README's table whatever a signature
holds."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from store_fixture import POINTWISE_PROBLEM, triton_candidate, verdict

from store import Store, export, open_reader

KEY = "pointwise-1a2b3c4d"
SIGNATURE = "where(x | y,\n      z) | w"
RUN_KERNEL = '''
import json, os
import torch
import kiln_kernels

site = kiln_kernels.SITES[0]
guarded = kiln_kernels.kernels()[site["key"]]
args = [torch.randn(p["shape"]) for p in site["proven"]]
with torch.no_grad():
    diff = (guarded(*args) - guarded.reference(*args)).abs().max().item()
print(json.dumps({"interpret": os.environ.get("TRITON_INTERPRET"), "diff": diff,
                  "stats": kiln_kernels.stats()}))
'''


def exported(tmp_path: Path) -> Path:
    """The package of a store whose one site has an accepted Triton kernel; its folder."""
    db = tmp_path / "kiln.db"
    with Store.open(db) as store:
        run = store.start_run(model_spec="examples/block.py", model_hash="1", gpu="NVIDIA H200",
                              versions={}, config={})
        site = store.add_site(
            run, key=KEY, family="pointwise", signature=SIGNATURE, ops=["aten.add.Tensor"],
            calls=1, share=0.5, time_ms=1.0, eager_ms=1.0, compile_ms=None, floor_ms=0.1,
            problem_source=POINTWISE_PROBLEM)
        kernel = store.add_candidate(site, parent_id=None, tier="triton", generator="rules",
                                     rationale="r", source=triton_candidate(256)).id
        store.add_verdict(kernel, verdict(accepted=True, latency_ms=0.5))
        store.finish_run(run)
    with open_reader(db) as reader:
        export(reader, "package", tmp_path / "out")
    return tmp_path / "out"


def python(code: str, folder: Path) -> subprocess.CompletedProcess[str]:
    """`code` in a fresh Python on the CPU, the package importable, TRITON_INTERPRET unset."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "TRITON_INTERPRET")}
    env.update(PYTHONPATH=str(folder), CUDA_VISIBLE_DEVICES="")
    return subprocess.run([sys.executable, "-c", code], cwd=folder, env=env,
                          capture_output=True, text=True, timeout=300)


def test_package_runs_its_triton_kernel_on_the_cpu_without_triton_interpret(tmp_path):
    result = python(RUN_KERNEL, exported(tmp_path))
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["interpret"] == "1"
    # The kernel itself ran: a kernel that failed would be switched off and counted.
    assert report["stats"] == {f"{KEY}: kernel": 1}
    assert report["diff"] < 1e-6


def test_triton_imported_first_is_one_clear_error(tmp_path):
    result = python("import triton\nimport kiln_kernels", exported(tmp_path))
    assert result.returncode != 0
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("RuntimeError: kiln_kernels: no CUDA device is visible"), last
    assert "set TRITON_INTERPRET=1" in last


def test_readme_table_keeps_one_row_per_site_whatever_the_signature(tmp_path):
    readme = (exported(tmp_path) / "kiln_kernels" / "README.md").read_text()
    rows = [line for line in readme.splitlines() if line.startswith(f"| `{KEY}`")]
    assert len(rows) == 1
    (row,) = rows
    unescaped = row.replace("\\|", "")
    assert unescaped.count("|") == 7, row  # six cells
    assert row.endswith("| where(x \\| y,       z) \\| w |")
    assert "TRITON_INTERPRET=1" in readme
