"""The install benchmark's --drafts: each of a site's first drafts installed alone and traced,
one row each, with why the draft was made and its calls counted, on the CPU under the Triton
interpreter (a real subprocess, as a user runs it)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROBLEM = '''import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)
        self.norm = nn.GroupNorm(2, 4)

    def forward(self, x):
        return self.norm(self.conv(x)).mean(dim=1)


def get_inputs():
    return [torch.randn(2, 3, 8, 8)]


def get_init_inputs():
    return []
'''


def test_each_draft_gets_a_row_with_why_and_its_calls(tmp_path):
    problem = tmp_path / "conv_norm.py"
    problem.write_text(PROBLEM)
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    run = subprocess.run([sys.executable, "-m", "bench.install_overhead_bench", str(problem),
                          "--dtype", "fp32", "--rules", "--drafts", "2", "--sites", "1",
                          "--device", "cpu"],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-2000:]
    rows = {line.split(" | ")[0].lstrip("| "): line.split(" | ")
            for line in run.stdout.splitlines() if line.startswith("| ")}
    assert "torch.compile" in rows, run.stdout
    assert "1 site(s), rules draft, traced" in rows, sorted(rows)
    second = [label for label in rows if label.startswith("1 site(s), rules draft 2, traced (")]
    assert len(second) == 1 and "channels-last" in second[0], sorted(rows)
    for label in ("1 site(s), rules draft, traced", second[0]):
        kernel_calls, fallbacks = rows[label][5], rows[label][6]
        assert (kernel_calls, fallbacks) == ("1", "0"), (label, rows[label])
