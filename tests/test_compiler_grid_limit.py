"""A launch's second grid dimension takes at most 65535 programs (CUDA's limit on gridDim.y): an
elementwise site larger than that many blocks of columns has each program walk several blocks."""

from __future__ import annotations

import re

import pytest
import torch

from generators.compiler import schedule
from generators.compiler.schedule import MAX_SPLITS, Schedule
from generators.cuda.program import write_cuda_compiled
from generators.site_graph import load_site_graph
from generators.triton.program import write_compiled
from tests.kernel_checks import assert_matches, one_input_problem, run_beside_problem

BODY = "torch.relu(x * 2.0)"


def second_grid_dimensions(source: str) -> list[int]:
    """The programs along the second dimension of each launch in a candidate's forward."""
    triton = re.findall(r"\w+\[\([^,\]]+, (\d+)\)\]\(", source)
    cuda = re.findall(r"grid=\([^,]+, (\d+), 1\)", source)
    return [int(n) for n in triton + cuda]


def test_a_site_of_more_column_blocks_than_the_grid_takes_launches_within_it(tmp_path):
    # 8192 × 8192: 65536 blocks of 1024 columns, one past the limit: two blocks a program, and
    # no program launched to walk only masked blocks.
    graph = load_site_graph(one_input_problem(tmp_path, BODY, "torch.randn(8192, 8192)"))
    for source in (write_compiled(graph, Schedule(1, 1024, 4)),
                   write_cuda_compiled(graph, Schedule(1, 1024, 4))):
        found = second_grid_dimensions(source)
        assert found == [32768] and MAX_SPLITS >= 32768, (found, source[-1500:])


@pytest.mark.parametrize(("limit", "programs"), [
    (3, 3),  # 15 blocks of 1024: five a program
    (10, 8),  # two a program: eight programs, not ten with the last two walking nothing
])
def test_each_program_walks_several_blocks_past_the_limit(tmp_path, monkeypatch, limit,
                                                         programs):
    problem = one_input_problem(tmp_path, BODY, "torch.randn(5, 3001)")
    monkeypatch.setattr(schedule, "MAX_SPLITS", limit)
    graph = load_site_graph(problem)
    source = write_compiled(graph, Schedule(1, 1024, 4))
    assert second_grid_dimensions(source) == [programs], source
    actual, expected = run_beside_problem(source, problem, seed=0)
    assert isinstance(actual, torch.Tensor)
    assert_matches(actual, expected, source)
    cuda = write_cuda_compiled(graph, Schedule(1, 1024, 4))
    assert second_grid_dimensions(cuda) == [programs], cuda
