"""On a GPU: Triton and CUDA candidates judged and timed, CUDA launches ordered with torch's
streams, and a sticky CUDA error costing only the candidate's own process."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from core.evaluate import EvalConfig, Evaluator
from core.evaluate.verdict import Reason

pytestmark = pytest.mark.gpu

DATA = Path(__file__).parent / "data" / "evaluate"
PROBLEM = DATA / "pointwise_problem.py"
DOUBLE = r"""
__global__ void double_it(const float* x, float* out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = 2.0f * x[i];
}
"""
# About 50 ms of GPU spinning: long enough that an unordered launch would read stale data.
SPIN_CYCLES = 100_000_000


def source(name: str) -> str:
    return (DATA / f"{name}.py").read_text()


@pytest.fixture(scope="module")
def evaluator():
    with Evaluator(EvalConfig(device="cuda"), workers=1) as shared:
        yield shared


def test_triton_and_cuda_candidates_are_accepted_and_timed(evaluator):
    triton_verdict, cuda_verdict = evaluator.evaluate_many([
        (PROBLEM, source("good_pointwise")), (PROBLEM, source("good_cuda_pointwise"))])
    for verdict, tier in ((triton_verdict, "triton"), (cuda_verdict, "cuda")):
        assert verdict.correct, verdict.reason
        assert verdict.tier == tier
        assert verdict.timing_device.startswith("cuda (")
        assert verdict.timing_trials == 100
        assert verdict.latency_ms > 0 and verdict.baseline_ms > 0
        assert verdict.kernel_launches >= 1


def test_an_illegal_address_costs_only_its_candidates_process(evaluator):
    before = evaluator.replacements
    bad, good = evaluator.evaluate_many([(PROBLEM, source("bad_cuda_illegal_address")),
                                         (PROBLEM, source("good_pointwise"))])
    assert bad.reason_code in (Reason.CUDA_ERROR, Reason.CRASH), bad.reason
    assert good.correct, good.reason
    assert evaluator.replacements == before


def test_a_pycuda_compile_error_keeps_its_line_number(evaluator):
    verdict = evaluator.evaluate(PROBLEM, source("bad_cuda_compile"))
    assert verdict.reason_code is Reason.COMPILE_ERROR and not verdict.compiled
    assert "kernel.cu(5)" in verdict.compile_log


@pytest.mark.parametrize("side_stream", [False, True], ids=["default-stream", "side-stream"])
def test_cuda_launches_are_ordered_with_torch_work(side_stream):
    from core.runtime.cuda import load_kernel

    kernel = load_kernel(DOUBLE, "double_it", "PPi")
    n = 1 << 20
    stream = torch.cuda.Stream() if side_stream else torch.cuda.current_stream()
    with torch.cuda.stream(stream):
        x = torch.zeros(n, device="cuda")
        torch.cuda._sleep(SPIN_CYCLES)
        x.fill_(3.0)
        out = torch.empty_like(x)
        kernel(grid=((n + 255) // 256, 1, 1), block=(256, 1, 1), args=(x, out, n))
        total = out.sum()
    torch.cuda.synchronize()
    assert total.item() == 6.0 * n
