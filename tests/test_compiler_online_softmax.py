"""A softmax's max and its sum of exp(x - max) in one walk over the row: the sum kept rescaled to
the max so far (an online max-and-sum), folded as (max, sum) pairs over lanes, splits, clusters
and grids, in both tiers. Correctness in every dtype and schedule is the compiler cases' (the
fused cases' softmaxes and log-softmaxes, and a masked softmax with -inf in its rows)."""

from __future__ import annotations

import re

import pytest
import torch

from generators.compiler.launches import main_kernel
from generators.compiler.schedule import Schedule
from generators.cuda.program import write_cuda_program
from generators.triton.program import write_program
from tests.compiler_cases import Case, load_module, write_problem
from tests.cuda_on_cpu import kernels_on_cpu


def _kernel(tmp_path, body: str, inputs: str, args: str = "x"):
    _, program = write_problem(tmp_path, Case(args, body, inputs))
    return program, main_kernel(program)


@pytest.mark.parametrize("body", ["torch.softmax(x, dim=-1)", "torch.log_softmax(x, dim=-1)"])
def test_a_softmax_sum_is_computed_in_its_max_walk(tmp_path, body):
    _, kernel = _kernel(tmp_path, body, "torch.randn(6, 40)")
    peak, total = kernel.reductions
    assert (peak.node.kind, total.node.kind) == ("amax", "sum")
    assert total.online_of is peak and total.level == peak.level == 0


@pytest.mark.parametrize("body, inputs, why", [
    ("torch.log_softmax(x, dim=1)", "torch.randn(4, 11, 13)",
     "rows side by side in memory: their lanes fold apart"),
    ("torch.logsumexp(x, dim=2)", "torch.randn(4, 11, 13)",
     "the max is guarded (where |max| is infinite) before it is subtracted"),
    ("(x * torch.exp(x - x.amax(-1, keepdim=True)).sum(-1, keepdim=True)).sum(-1)",
     "torch.randn(4, 13)", "another reduction of the row reads the sum"),
])
def test_sums_that_are_not_a_plain_softmax_keep_their_own_walk(tmp_path, body, inputs, why):
    _, kernel = _kernel(tmp_path, body, inputs)
    assert all(r.online_of is None for r in kernel.reductions), why


def test_both_tiers_walk_a_softmax_row_twice_not_three_times(tmp_path):
    program, _ = _kernel(tmp_path, "torch.softmax(x, dim=-1)", "torch.randn(6, 4000)")
    cuda = write_cuda_program(program, Schedule(1, 1024, 4), "softmax").split("__global__")[1]
    # One walk for the max and the sum, one for the outputs.
    assert len(re.findall(r"for \(int base\d+ = ", cuda)) == 2
    assert "online_add(" in cuda and "fold_row_pair<LANES>(" in cuda
    triton = write_program(program, Schedule(1, 1024, 4), "softmax")
    assert len(re.findall(r"for step\d+ in range\(", triton)) == 2


def test_a_row_kept_on_chip_walks_its_sum_on_its_own(tmp_path):
    program, kernel = _kernel(tmp_path, "torch.softmax(x, dim=-1)", "torch.randn(6, 40000)")
    kept = write_cuda_program(program, Schedule(1, 1024, 4, cluster_blocks=4, keep_row=True),
                              "softmax").split("__global__")[1]
    # The max's walk, the sum's walk (from the kept share), the outputs': two exchanges.
    assert "online_add(" not in kept and kept.count("wait_for_bytes(") == 2
    assert len(re.findall(r"for \(int base\d+ = ", kept)) == 3
    # Read again from L2, the sum stays in the max's walk: one exchange.
    unkept = write_cuda_program(program, Schedule(1, 1024, 4, cluster_blocks=4),
                                "softmax").split("__global__")[1]
    assert "online_add(" in unkept and unkept.count("wait_for_bytes(") == 1
    # The plan itself is unchanged for the next schedule.
    assert kernel.reductions[1].online_of is kernel.reductions[0]


def test_a_row_of_minus_infinity_gives_nan_as_pytorch_does(tmp_path):
    problem, program = write_problem(tmp_path, Case(
        "x, m", "torch.softmax(x.masked_fill(m, float('-inf')), dim=-1)",
        "torch.randn(6, 40), torch.rand(6, 40) > 0.5"))
    reference = load_module(problem, "masked_problem")
    x, mask = torch.randn(6, 40), torch.rand(6, 40) > 0.5
    mask[2] = True
    expected = reference.Model()(x, mask)
    path = tmp_path / "kernel.py"
    path.write_text(write_cuda_program(program, Schedule(2, 8, 4), "masked softmax"))
    with kernels_on_cpu():
        got = load_module(path, "masked_kernel").ModelNew()(x, mask)
    assert torch.equal(torch.isnan(got), torch.isnan(expected)) and torch.isnan(got[2]).all()
    torch.testing.assert_close(torch.nan_to_num(got), torch.nan_to_num(expected))


@pytest.mark.parametrize("body", ["torch.softmax(x, dim=-1)", "torch.log_softmax(x, dim=-1)"])
def test_rows_with_infinities_and_nans_match_pytorch_in_both_tiers(tmp_path, body):
    # +inf makes PyTorch's sum exp(inf - inf): the whole row NaN, which counting a value at the
    # max as one would hide; a NaN spreads over its row; -inf values alone count nothing.
    problem, program = write_problem(tmp_path, Case("x", body, "torch.randn(5, 40)"))
    x = torch.randn(5, 40)
    x[1, 5] = float("inf")
    x[2, 3] = float("nan")
    x[3] = float("-inf")
    x[3, 7] = 2.0
    x[4, ::3] = float("-inf")
    expected = load_module(problem, "special_problem").Model()(x)
    for tier, write in (("cuda", write_cuda_program), ("triton", write_program)):
        path = tmp_path / f"{tier}.py"
        path.write_text(write(program, Schedule(1, 16, 1), body))
        with kernels_on_cpu():
            got = load_module(path, f"special_{tier}").ModelNew()(x)
        assert torch.equal(torch.isnan(got), torch.isnan(expected)), (tier, got)
        torch.testing.assert_close(torch.nan_to_num(got), torch.nan_to_num(expected))


@pytest.mark.parametrize("body", ["torch.softmax(x, dim=-1)", "torch.log_softmax(x, dim=-1)"])
def test_a_row_held_whole_in_registers_takes_each_exponential_once(tmp_path, body):
    program, _ = _kernel(tmp_path, body, "torch.randn(6, 40)")
    held = write_program(program, Schedule(1, 64, 4), "softmax")
    assert "for step" not in held and held.count("tl.exp(") == 1, held
    # Looped, the sum is still taken in the max's walk.
    looped = write_program(program, Schedule(1, 16, 4), "softmax")
    assert len(re.findall(r"for step\d+ in range\(", looped)) == 2, looped
