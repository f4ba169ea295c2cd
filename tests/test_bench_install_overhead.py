"""The install benchmark's --drafts: each of a site's first drafts installed alone and traced,
one row each, with why the draft was made and its calls counted, on the CPU under the Triton
interpreter (a real subprocess, as a user runs it)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import torch

from bench.install_overhead_bench import ChannelsLastEntry
from core.profile.roofline import GpuPeaks
from core.profile.sites import find_sites
from core.runtime.capture import capture

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


def bench_rows(folder: Path, *extra: str) -> tuple[str, dict[str, list[str]]]:
    """The bench's header and its table on the CPU, by the first cell of each row."""
    problem = folder / "conv_norm.py"
    problem.write_text(PROBLEM)
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    run = subprocess.run([sys.executable, "-m", "bench.install_overhead_bench", str(problem),
                          "--dtype", "fp32", "--rules", "--sites", "1", "--device", "cpu",
                          *extra],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-2000:]
    header = next(line for line in run.stdout.splitlines() if "largest first" in line)
    return header, {line.split(" | ")[0].lstrip("| "): line.split(" | ")
                    for line in run.stdout.splitlines() if line.startswith("| ")}


def assert_kernel_ran(rows: dict[str, list[str]], label: str) -> None:
    kernel_calls, fallbacks = rows[label][5], rows[label][6]
    assert (kernel_calls, fallbacks) == ("1", "0"), (label, rows[label])


def test_each_draft_gets_a_row_with_why_and_its_calls(tmp_path):
    _, rows = bench_rows(tmp_path, "--drafts", "2")
    assert "torch.compile" in rows, sorted(rows)
    assert "1 site(s), rules draft, traced" in rows, sorted(rows)
    second = [label for label in rows if label.startswith("1 site(s), rules draft 2, traced (")]
    assert len(second) == 1 and "channels-last" in second[0], sorted(rows)
    for label in ("1 site(s), rules draft, traced", second[0]):
        assert_kernel_ran(rows, label)


def test_behind_a_channels_last_entry_the_kernels_are_proven_on_what_they_get(tmp_path):
    """Sites captured behind the entry see channels-last tensors, and so do their kernels in
    the installed model: every call runs the kernel, none falls back as unproven."""
    header, rows = bench_rows(tmp_path, "--channels-last")
    namespace: dict[str, object] = {}
    exec(PROBLEM, namespace)
    model, inputs = namespace["Model"]().eval(), tuple(namespace["get_inputs"]())
    keys = [find_sites(capture(m, inputs, torch.device("cpu")), GpuPeaks()).sites[0].key
            for m in (model, ChannelsLastEntry(model))]
    assert keys[0] != keys[1], "the entry left the site's layout as it was"
    assert f"largest first: {keys[1]} " in header, (keys, header)
    assert {"torch.compile", "torch.compile, channels-last entry"} <= set(rows), sorted(rows)
    assert_kernel_ran(rows, "1 site(s), own ops")
    assert_kernel_ran(rows, "1 site(s), rules draft, traced")
