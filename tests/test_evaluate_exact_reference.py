"""Outputs that are rounding noise (the mean of a normalized tensor, zero in exact arithmetic) are
judged against the reference run in fp64: a correct kernel is as close to it as PyTorch, a wrong
one is not, and an output PyTorch computes accurately is held to the tolerance as before."""

from __future__ import annotations

import torch

from core.evaluate import EvalConfig, Evaluator
from core.evaluate.correctness import TOLERANCES
from core.evaluate.exact_reference import as_close_as_pytorch, fp64_outputs
from generators.rules import RulesGenerator

FP32 = {torch.float32: ("fp32", TOLERANCES["fp32"])}

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
    x = torch.randn(4, 16, 3, 5, 6)
    model = NoiseMean()
    reference = model(x)
    exact = fp64_outputs(model, [x])
    assert exact.dtype == torch.float64
    # The same mean summed in another order: as correct, and elsewhere in the noise.
    other = torch.nn.functional.group_norm(x, 8).flatten(1).flip(1).sum(1) / x[0].numel()
    assert (other - reference).abs().max() > TOLERANCES["fp32"] * reference.abs().max()
    assert as_close_as_pytorch(other, reference, exact, FP32) is not None
    assert as_close_as_pytorch(torch.full_like(reference, 1e-3), reference, exact, FP32) is None


def test_an_accurate_output_is_held_to_the_tolerance_as_before():
    x = torch.randn(64, 32)
    reference = torch.softmax(x, dim=1)
    exact = torch.softmax(x.double(), dim=1)
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
