"""Outputs that are rounding noise (the mean of a normalized tensor, zero in exact arithmetic) are
judged against the reference run in fp64: a correct kernel is as close to it as PyTorch, a wrong
one is not, and an output PyTorch computes accurately is held to the tolerance as before. A
half-precision output may be only as far from fp64 as PyTorch's own."""

from __future__ import annotations

import pytest
import torch

from core.evaluate import EvalConfig, Evaluator
from core.evaluate.correctness import TOLERANCES
from core.evaluate.exact_reference import (
    FULL_PRECISION,
    ExactAnswer,
    as_close_as_pytorch,
    exact_answer,
    exact_bytes,
    no_room_for_exact,
)
from generators.rules import RulesGenerator

FP32 = {torch.float32: ("fp32", TOLERANCES["fp32"])}
BF16 = {torch.bfloat16: ("bf16", TOLERANCES["bf16"])}

PROBLEM = '''
import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    """KernelBench's Conv3d + GroupNorm + mean, as Kiln cuts it: the mean is a site of its own,
    its input the group norm's output."""

    def forward(self, x):
        return x.mean(dim=[1, 2, 3, 4])


def get_inputs():
    return [F.group_norm(torch.randn(4, 16, 3, 5, 6), 8)]


def get_init_inputs():
    return []
'''

CONSTANT = '''
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def fill(out_ptr, n, BLOCK: tl.constexpr):
    offsets = tl.arange(0, BLOCK)
    tl.store(out_ptr + offsets, tl.full((BLOCK,), 1e-3, tl.float32), mask=offsets < n)


class ModelNew(nn.Module):
    def forward(self, x):
        out = torch.empty(x.shape[0], device=x.device, dtype=x.dtype)
        fill[(1,)](out, x.shape[0], BLOCK=8)
        return out
'''


class NoiseMean(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.group_norm(x, 8).mean(dim=[1, 2, 3, 4])


def test_another_summation_order_is_as_close_to_fp64_as_pytorch():
    torch.manual_seed(0)
    x = torch.randn(4, 16, 3, 5, 6)
    model = NoiseMean()
    reference = model(x)
    exact = exact_answer(model, [x])
    assert exact.exact.dtype == torch.float64
    # The same mean summed in another order: as correct, and elsewhere in the noise.
    other = torch.nn.functional.group_norm(x, 8).flatten(1).flip(1).sum(1) / x[0].numel()
    assert (other - reference).abs().max() > TOLERANCES["fp32"] * reference.abs().max()
    assert as_close_as_pytorch(other, reference, exact, FP32) is not None
    assert as_close_as_pytorch(torch.full_like(reference, 1e-3), reference, exact, FP32) is None


def test_an_accurate_output_is_held_to_the_tolerance_as_before():
    torch.manual_seed(0)
    x = torch.randn(64, 32)
    reference = torch.softmax(x, dim=1)
    exact = ExactAnswer(torch.softmax(x.double(), dim=1), reference)
    off = reference * (1 + 3 * TOLERANCES["fp32"])
    assert as_close_as_pytorch(off, reference, exact, FP32) is None
    assert as_close_as_pytorch(reference.clone(), reference, exact, FP32) is not None


def test_the_evaluator_accepts_a_correct_kernel_for_a_noise_output_and_refuses_a_wrong_one(
        tmp_path):
    problem = tmp_path / "problem.py"
    problem.write_text(PROBLEM)
    drafts = [p for p in RulesGenerator().propose(problem, None, 8).children
              if p.settings.get("writer") == "write_compiled"]
    assert drafts
    with Evaluator(EvalConfig(device="cpu", trials=1, warmup=0), workers=1) as evaluator:
        correct = evaluator.evaluate(problem, drafts[0].source)
        wrong = evaluator.evaluate(problem, CONSTANT)
    assert correct.correct, correct.reason
    assert "fp64" in correct.tolerance_name, correct.tolerance_name
    assert not wrong.correct and "tolerance" in wrong.reason, wrong.reason


def test_the_end_to_end_check_judges_a_noise_output_against_fp64_too():
    from core.optimize.e2e import check_outputs

    model, inputs = NoiseMean(), (torch.randn(4, 16, 3, 5, 6),)

    def other_order(x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.group_norm(x, 8).flatten(1).flip(1).sum(1) / x[0].numel()

    assert check_outputs(model, other_order, inputs, tf32=False, device="cpu").mismatch == ""
    wrong = check_outputs(model, lambda x: torch.full((x.shape[0],), 1e-3), inputs, tf32=False,
                          device="cpu")
    assert "tolerance" in wrong.mismatch, wrong.mismatch


def test_a_half_precision_output_may_be_as_far_from_fp64_as_pytorchs_and_no_further():
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 64, 32) for _ in range(3))
    fp64 = torch.softmax(q.double() @ k.double().transpose(1, 2), -1) @ v.double()
    # PyTorch in bf16 rounds the scores, the weights and the products; a kernel that keeps them
    # in fp32 and rounds once at the end is nearer the exact answer.
    reference = torch.softmax(q.bfloat16() @ k.bfloat16().transpose(1, 2), -1) @ v.bfloat16()
    exact = ExactAnswer(fp64, reference)
    nearer = fp64.bfloat16()
    assert as_close_as_pytorch(nearer, reference, exact, BF16) is not None
    further = reference * 1.05
    assert as_close_as_pytorch(further, reference, exact, BF16) is None
    # Where the end-to-end check leaves half precision to its own rule.
    assert as_close_as_pytorch(nearer, reference, exact, BF16, FULL_PRECISION) is None


def test_the_fp64_answers_bytes_are_counted_before_it_is_made():
    model = torch.nn.Linear(64, 32)
    x = torch.randn(8, 64)
    # The model copied (fp32) and in fp64, the input in fp64, the fp64 answer.
    weights = 64 * 32 + 32
    assert exact_bytes(model, [x], model(x)) == weights * (4 + 8) + 8 * 64 * 8 + 8 * 32 * 8
    assert no_room_for_exact(model, [x], model(x), torch.device("cpu")) is None


@pytest.mark.gpu
@pytest.mark.parametrize(("features", "rows"), [(2048, 256), (64, 1 << 16)],
                         ids=["a model larger than its input", "an input larger than its model"])
def test_on_a_gpu_the_fp64_answer_takes_no_more_than_counted(features, rows):
    model = torch.nn.Linear(features, features).cuda()
    x = torch.randn(rows, features, device="cuda")
    with torch.no_grad():
        out = model(x)
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    exact_answer(model, [x])
    assert torch.cuda.max_memory_allocated() - before <= exact_bytes(model, [x], out)
    assert no_room_for_exact(model, [x], out, torch.device("cuda")) is None
