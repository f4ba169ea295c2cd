"""fp32 stays fp32 unless the run allows TF32: the static rules, the tolerances, the floors, the
drafts and the candidate's process all follow the one setting, and so do the baselines."""

from __future__ import annotations

import pytest
import torch
import triton

from core.evaluate import EvalConfig, Evaluator
from core.evaluate.correctness import tolerance_name
from core.evaluate.static_rules import check_candidate
from core.profile.roofline import GpuPeaks, region_cost
from core.runtime.capture import capture
from core.timing.precision import TRITON_FP32_DEFAULT, fp32_matmuls, hold_candidate_to
from generators.rules import RulesGenerator
from tests.test_evaluate_static import MATMUL

CONV = ("import torch\nimport torch.nn.functional as F\nclass Model(torch.nn.Module):\n"
        "    def forward(self, x, w):\n        return F.relu(F.conv2d(x, w))\n")

PROBLEM = '''
import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, a, b):
        return torch.relu(a @ b)


def get_inputs():
    return [torch.randn(32, 32), torch.randn(32, 32)]


def get_init_inputs():
    return []
'''


def matmul_candidate(precision: str) -> str:
    """A relu(a @ b) kernel in one 32×32 tile, its dot's precision as given."""
    return f'''
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def matmul_relu(a_ptr, b_ptr, out_ptr, N: tl.constexpr):
    rows = tl.arange(0, N)[:, None] * N
    cols = tl.arange(0, N)[None, :]
    product = tl.dot(tl.load(a_ptr + rows + cols), tl.load(b_ptr + rows + cols){precision})
    tl.store(out_ptr + rows + cols, tl.maximum(product, 0.0))


class ModelNew(nn.Module):
    def forward(self, a, b):
        out = torch.empty_like(a)
        matmul_relu[(1,)](a, b, out, N=32)
        return out
'''


@pytest.mark.parametrize(("precision", "refused"), [
    (', input_precision="tf32"', True),
    (", allow_tf32=True", True),
    (', None, "tf32"', True),
    (", input_precision=N", True),  # not a literal: could be anything at launch
    (', input_precision="tf32x3"', False),
    (', input_precision="ieee"', False),
    ("", False),
])
def test_a_matmul_site_refuses_tf32_products(precision, refused):
    source = matmul_candidate(precision)
    report = check_candidate(source, MATMUL)
    assert (not report.ok) is refused, report.violations
    if refused:
        assert "tf32" in report.violations[0].lower() or "literal" in report.violations[0]


def test_tf32_is_allowed_on_a_convolution_site_and_in_runs_that_allow_it():
    source = matmul_candidate(', input_precision="tf32"')
    assert check_candidate(source, CONV, tf32=True).ok
    assert EvalConfig(device="cpu").tf32_for({"conv"})
    assert not EvalConfig(device="cpu").tf32_for({"matmul"})
    assert EvalConfig(device="cpu", allow_tf32=True).tf32_for({"matmul"})


def test_cuda_sources_that_use_tf32_are_refused_on_fp32_sites():
    source = matmul_candidate("") + (
        '\nSOURCE = """__global__ void k(float* x) '
        '{ asm("cvt.rna.tf32.f32 %0, %0;" : "+f"(x[0])); }"""\n')
    report = check_candidate(source, MATMUL)
    assert any("CUDA source uses TF32" in v for v in report.violations), report.violations
    assert check_candidate(source, MATMUL, tf32=True).ok


@pytest.mark.parametrize(("tf32", "device", "name"), [
    (False, "cuda", "fp32"), (True, "cuda", "tf32"), (True, "cpu", "fp32")])
def test_fp32_outputs_are_held_to_the_precision_of_their_baseline(tf32, device, name):
    assert tolerance_name(torch.float32, tf32, device) == name
    assert tolerance_name(torch.bfloat16, tf32, device) == "bf16"


def test_the_candidates_process_multiplies_triton_dots_exactly_unless_tf32_is_allowed(
        monkeypatch):
    monkeypatch.delenv(TRITON_FP32_DEFAULT, raising=False)
    before = torch.backends.cuda.matmul.allow_tf32
    try:
        hold_candidate_to(False)
        assert triton.knobs.language.fp32_default == "ieee"
        assert torch.backends.cuda.matmul.allow_tf32 is False
        hold_candidate_to(True)
        assert triton.knobs.language.fp32_default is None  # Triton's own default: tf32
        assert torch.backends.cuda.matmul.allow_tf32 is True
    finally:
        torch.backends.cuda.matmul.allow_tf32 = before


def test_baselines_multiply_as_the_run_allows_and_the_setting_is_put_back():
    before = torch.backends.cuda.matmul.allow_tf32
    with fp32_matmuls(not before):
        assert torch.backends.cuda.matmul.allow_tf32 is (not before)
    assert torch.backends.cuda.matmul.allow_tf32 is before


def test_the_evaluator_refuses_tf32_unless_the_run_allows_it(tmp_path):
    problem = tmp_path / "problem.py"
    problem.write_text(PROBLEM)
    source = matmul_candidate(', input_precision="tf32"')
    with Evaluator(EvalConfig(device="cpu", trials=1, warmup=0), workers=1) as evaluator:
        refused = evaluator.evaluate(problem, source)
    assert not refused.correct and "TF32" in refused.reason, refused.reason
    allowed = EvalConfig(device="cpu", trials=1, warmup=0, allow_tf32=True)
    with Evaluator(allowed, workers=1) as evaluator:
        verdict = evaluator.evaluate(problem, source)
    assert verdict.correct, verdict.reason


def _region_floor(model: torch.nn.Module, inputs: list[torch.Tensor], allow_tf32: bool
                  ) -> float:
    graph = capture(model, inputs, torch.device("cpu")).graphs[0]
    anchored = [r for r in graph.regions if r.family in ("matmul", "conv")]
    return region_cost(anchored[0], GpuPeaks(), allow_tf32).floor_ms


def test_matrix_floors_are_at_the_rate_the_baseline_may_reach():
    peaks = GpuPeaks()
    # fp32 at fp32's accuracy: three tf32 products, faster than fp32 arithmetic.
    assert peaks.matrix_peak(torch.float32) == pytest.approx(peaks.matrix_flops["tf32"] / 3)
    assert peaks.matrix_peak(torch.float32, tf32=True) == peaks.matrix_flops["tf32"]
    linear = torch.nn.Linear(2048, 2048, bias=False)
    x = [torch.randn(2048, 2048)]
    assert _region_floor(linear, x, True) < _region_floor(linear, x, False)
    conv = torch.nn.Conv2d(256, 256, 3, bias=False)
    images = [torch.randn(8, 256, 64, 64)]
    # cuDNN runs fp32 convolutions as TF32 by default: so does their floor, allowed or not.
    assert _region_floor(conv, images, False) == _region_floor(conv, images, True)


def test_the_rules_generator_drafts_plain_tf32_only_when_the_run_allows_it(tmp_path):
    problem = tmp_path / "problem.py"
    problem.write_text(PROBLEM.replace("32, 32", "256, 256"))
    strict = RulesGenerator().propose(problem, None, n=8).children
    assert strict and all(c.settings.get("precision") != "tf32" for c in strict)
    allowed = RulesGenerator(allow_tf32=True).propose(problem, None, n=8).children
    assert allowed[0].settings["precision"] == "tf32", [c.settings for c in allowed]
    assert 'input_precision="tf32"' in allowed[0].source
