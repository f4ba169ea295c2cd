"""Without a GPU, CUDA candidates are compile-checked with nvcc; errors keep their line numbers."""

from __future__ import annotations

from pathlib import Path

from core.evaluate import EvalConfig, Evaluator
from core.evaluate.verdict import Reason
from core.runtime.cuda import nvcc_check, wrap_source

DATA = Path(__file__).parent / "data" / "evaluate"
PROBLEM = DATA / "pointwise_problem.py"


def test_nvcc_reports_errors_at_the_line_of_the_cuda_source():
    ok, log = nvcc_check("__global__ void k(float* x) {\n\n  x[0] = missing;\n}\n")
    assert not ok
    assert 'kernel.cu(3): error: identifier "missing" is undefined' in log


def test_the_wrapper_keeps_kernel_names_unmangled_and_lines_unshifted():
    wrapped = wrap_source("__global__ void k() {}")
    assert wrapped.startswith('extern "C" {\n#line 1 "kernel.cu"\n__global__ void k() {}')
    ok, log = nvcc_check("__global__ void k(float* x) { x[0] = 1.0f; }")
    assert ok, log


def test_cuda_candidates_on_a_cpu_are_compile_checked():
    with Evaluator(EvalConfig(device="cpu"), workers=1) as evaluator:
        good, broken = evaluator.evaluate_many([
            (PROBLEM, (DATA / "good_cuda_pointwise.py").read_text()),
            (PROBLEM, (DATA / "bad_cuda_compile.py").read_text()),
        ])
        assert evaluator.pool.workers == [None]
    assert good.reason_code is Reason.NEEDS_GPU and good.compiled and not good.accepted
    assert good.tier == "cuda"
    assert broken.reason_code is Reason.COMPILE_ERROR and not broken.compiled
    assert "kernel.cu(5) [candidate line 11]" in broken.compile_log
    assert "undeclared_gain" in broken.compile_log
