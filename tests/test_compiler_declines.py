"""A site the kernel compiler cannot plan says why, naming the op that stopped it: in
`--list-sites` (table and JSON) and in the store."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from generators.compiler.lower import lower_problem
from generators.site_graph import Unsupported
from store import open_reader

REPO = Path(__file__).resolve().parents[1]
MODEL = '''import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x, y):
        return torch.atan(x).sum(-1), torch.softmax(y, dim=0)


def get_inputs():
    return [torch.randn(8, 32), torch.randn(16, 12)]


def get_init_inputs():
    return []
'''


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "core.optimize", *args, "--device", "cpu",
                           "--trials", "1", "--warmup", "0"], capture_output=True, text=True,
                          cwd=REPO, timeout=600)


def test_list_sites_names_the_op_that_stops_the_compiler(tmp_path):
    model = tmp_path / "model.py"
    model.write_text(MODEL)
    result = run(str(model), "--list-sites", "--json", "--out", str(tmp_path / "out"))
    assert result.returncode == 0, result.stderr
    sites = {s["signature"].split(" |")[0]: s for s in json.loads(result.stdout)["sites"]}
    assert sites["atan → sum"]["declined"] == ("atan (aten.atan) has no lowering to the "
                                               "compiler's IR")
    assert sites["softmax"]["declined"] is None
    table = run(str(model), "--list-sites", "--out", str(tmp_path / "out"))
    assert "no kernel: atan (aten.atan) has no lowering" in table.stdout


def test_the_store_keeps_each_sites_decline(tmp_path):
    model = tmp_path / "model.py"
    model.write_text(MODEL)
    db = tmp_path / "kiln.db"
    result = run(str(model), "--db", str(db), "--max-candidates", "2", "--sites", "1",
                 "--no-e2e", "--no-site-compile", "--workers", "1", "--out", str(tmp_path / "out"))
    assert result.returncode == 0, result.stderr
    with open_reader(db) as reader:
        sites = {s.signature.split(" |")[0]: s for s in reader.sites(reader.latest_run_id())}
    assert "atan (aten.atan)" in sites["atan → sum"].declined
    assert sites["softmax"].declined is None


@pytest.mark.parametrize(("body", "why"), [
    ("x.add_(y[:8, :1].sum()).sum(-1)",
     r"add_ \(aten.add_\) overwrites a value the site reads elsewhere"),
    ("x.copy_(y[:8, :1]).sum(-1)",
     r"copy_ \(aten.copy_\) writes into a tensor the site did not make for it"),
], ids=["an in-place op", "a copy"])
def test_a_write_into_an_input_is_declined_by_name(tmp_path, body, why):
    problem = tmp_path / "problem.py"
    problem.write_text(MODEL.replace("return torch.atan(x).sum(-1), torch.softmax(y, dim=0)",
                                     f"return {body}"))
    with pytest.raises(Unsupported, match=why):
        lower_problem(problem)
