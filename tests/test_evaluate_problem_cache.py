"""A judge keeps the last few problems loaded: a search whose steps alternate between sites loads
each site's problem once, a changed file is loaded again, and the cache stays bounded."""

from __future__ import annotations

import os

import pytest

import core.evaluate.judge as judge_module
from core.evaluate.judge import LOADED_PROBLEMS, Judge
from core.evaluate.zygote import Zygote

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


@pytest.fixture(scope="module")
def zygote():
    started = Zygote("cpu")
    yield started
    started.close()


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


def write(folder, name: str, factor: float):
    path = folder / f"{name}.py"
    path.write_text(PROBLEM.format(factor=factor))
    return path


def test_alternating_problems_are_each_loaded_once(tmp_path, zygote, loads):
    judge = Judge(tmp_path, zygote, tmp_path / "log")
    a, b = write(tmp_path, "a", 2.0), write(tmp_path, "b", 3.0)
    for path in (a, b, a, b, a):
        assert judge.load(str(path)).path == path.resolve()
    assert loads == ["a.py", "b.py"]


def test_a_changed_problem_is_loaded_again(tmp_path, zygote, loads):
    judge = Judge(tmp_path, zygote, tmp_path / "log")
    a = write(tmp_path, "a", 2.0)
    judge.load(str(a))
    write(tmp_path, "a", 4.0)
    stat = a.stat()
    os.utime(a, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000))
    judge.load(str(a))
    assert loads == ["a.py", "a.py"]


def test_the_oldest_problem_leaves_the_cache(tmp_path, zygote, loads):
    judge = Judge(tmp_path, zygote, tmp_path / "log")
    paths = [write(tmp_path, f"p{i}", float(i)) for i in range(LOADED_PROBLEMS + 1)]
    for path in paths:
        judge.load(str(path))
    assert len(judge.loaded) == LOADED_PROBLEMS
    judge.load(str(paths[-1]))
    judge.load(str(paths[0]))  # evicted: loaded again
    assert loads == [p.name for p in paths] + ["p0.py"]
