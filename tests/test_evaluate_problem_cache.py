"""A judge keeps the last few problems loaded: a search whose steps alternate between sites loads
each site's problem once, a changed file is loaded again, and the cache stays bounded."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import core.evaluate.judge as judge_module
from core.evaluate.judge import LOADED_PROBLEMS, LoadedProblems

PROBLEM = """
import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x):
        return x * {factor}


def get_inputs():
    return [torch.randn(16)]


def get_init_inputs():
    return []
"""


@pytest.fixture
def loads(monkeypatch):
    """The paths the judge loads, in order (the real loader, counted)."""
    seen: list[str] = []
    load = judge_module.load_problem

    def counted(path):
        seen.append(path.name)
        return load(path)

    monkeypatch.setattr(judge_module, "load_problem", counted)
    return seen


def write(folder: Path, name: str, factor: float) -> Path:
    path = folder / f"{name}.py"
    path.write_text(PROBLEM.format(factor=factor))
    return path.resolve()


def get(cache: LoadedProblems, path: Path):
    problem, sizes = cache.get(path, (str(path), path.stat().st_mtime_ns))
    assert problem.path == path and sizes.inputs == 16 * 4
    return problem


def test_alternating_problems_are_each_loaded_once(tmp_path, loads):
    cache = LoadedProblems()
    a, b = write(tmp_path, "a", 2.0), write(tmp_path, "b", 3.0)
    for path in (a, b, a, b, a):
        get(cache, path)
    assert loads == ["a.py", "b.py"]


def test_a_changed_problem_is_loaded_again(tmp_path, loads):
    cache = LoadedProblems()
    a = write(tmp_path, "a", 2.0)
    get(cache, a)
    write(tmp_path, "a", 4.0)
    stat = a.stat()
    os.utime(a, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000))
    get(cache, a)
    assert loads == ["a.py", "a.py"]


def test_the_oldest_problem_leaves_the_cache(tmp_path, loads):
    cache = LoadedProblems()
    paths = [write(tmp_path, f"p{i}", float(i)) for i in range(LOADED_PROBLEMS + 1)]
    for path in paths:
        get(cache, path)
    assert len(cache.loaded) == LOADED_PROBLEMS
    get(cache, paths[-1])
    get(cache, paths[0])  # evicted: loaded again
    assert loads == [p.name for p in paths] + ["p0.py"]
