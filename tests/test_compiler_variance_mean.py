"""A norm's mean beside its variance: both tiers take the mean from the variance's shifted sum
(the shift plus that sum over the count), with no accumulator of its own, and match PyTorch on
values far from zero, where a plain sum and the shifted one part ways."""

from __future__ import annotations

import re

import pytest

from generators.compiler.schedule import Schedule
from generators.cuda.program import write_cuda_program
from generators.triton.program import write_program
from tests.compiler_cases import Case, check, write_problem
from tests.cuda_on_cpu import kernels_on_cpu

# Rows of 24 walked 8 columns a step: a looped kernel, which keeps sums shifted by a row's
# first value.
LOOPED = Schedule(1, 8, 4)
OFFSET_CASES = [
    Case("x, w, b", "F.layer_norm(x, (24,), w, b)",
         "1000 + torch.randn(9, 24), torch.randn(24), torch.randn(24)"),
    Case("x, w, b", "F.group_norm(x, 3, w, b)",
         "-500 + torch.randn(2, 12, 5, 3), torch.randn(12), torch.randn(12)"),
]


def _layer_norm_source(tmp_path, write) -> str:
    case = Case("x", "F.layer_norm(x, (24,))", "torch.randn(9, 24)")
    _, program = write_problem(tmp_path, case)
    return write(program, LOOPED, case.body)


def test_the_triton_mean_is_the_shift_plus_the_shifted_sum(tmp_path):
    kernel = _layer_norm_source(tmp_path, write_program)
    assert len(re.findall(r"acc\d+ = tl\.full\(", kernel)) == 2, kernel
    assert re.search(r"r\d+ = x\d+ \+ v\d+ / 24\.0\n", kernel), kernel


def test_the_cuda_mean_is_the_shift_plus_the_shifted_sum(tmp_path):
    kernel = _layer_norm_source(tmp_path, write_cuda_program).split("__global__")[1]
    assert len(re.findall(r"float acc\d+ = 0;", kernel)) == 2, kernel
    assert re.search(r"= x\d+ \+ acc\d+ / 24\.0f;", kernel), kernel


@pytest.mark.parametrize("case", OFFSET_CASES, ids=[c.id for c in OFFSET_CASES])
def test_norms_of_values_far_from_zero_match_pytorch(tmp_path, case):
    check(tmp_path / "triton", case, write_program, extra=(LOOPED,))
    with kernels_on_cpu():
        check(tmp_path / "cuda", case, write_cuda_program, extra=(LOOPED,))
