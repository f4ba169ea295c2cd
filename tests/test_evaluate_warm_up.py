"""The zygote's warm-up on a GPU machine compiles a Triton kernel without starting CUDA (a
context cannot cross a fork) and without touching the user's Triton cache. In a process of its
own: the tests' Triton runs interpreted, and compiling needs the compiler."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from core.evaluate.warm_kernel import compile_once

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = """
import os, torch
from core.evaluate.warm_kernel import compile_once
compile_once()
print(torch.cuda.is_initialized(), os.environ["TRITON_CACHE_DIR"])
"""


def test_tritons_compiler_is_warmed_without_cuda_and_without_the_cache(tmp_path):
    cache = tmp_path / "triton-cache"
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.update(TRITON_CACHE_DIR=str(cache), PYTHONPATH=str(ROOT))
    result = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True,
                            env=env, cwd=ROOT, timeout=240)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.split() == ["False", str(cache)]
    assert not cache.exists(), sorted(cache.rglob("*"))


def test_nothing_is_compiled_where_kernels_are_interpreted(monkeypatch, tmp_path):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "cache"))
    compile_once()
    assert not (tmp_path / "cache").exists()
