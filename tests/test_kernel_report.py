"""Kernel reports: the ptxas, SASS and PTX parsers on recorded tool output, the real nvcc and
cuobjdump on hand-written and generated CUDA, Triton's PTX compiled here, Triton under the
interpreter, and the verdict's new fields."""

from __future__ import annotations

import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch

from bench.sm90_compile_bench import compile_for_sm90
from core.evaluate import EvalConfig, evaluate
from core.evaluate.kernel_report import (
    INTERPRETER_NOTE,
    KernelReport,
    KernelStats,
    candidate_report,
    cuda_source_report,
    cuda_sources,
    parse_ptx,
    parse_ptxas,
    parse_sass,
)
from core.evaluate.verdict import Verdict
from core.runtime.problem_loader import import_file
from generators.compiler.schedule import Schedule
from generators.cuda.pointwise import CudaPointwiseConfig, write_cuda_pointwise
from generators.cuda.row_reduction import CudaReductionConfig, write_cuda_reduction
from generators.site_graph import load_site_graph
from generators.triton.program import write_compiled
from tests.kernel_checks import one_input_problem

DATA = Path(__file__).parent / "data" / "kernel_report"
# Recorded with `nvcc -arch=sm_90 -cubin --resource-usage` (CUDA 13.0) on the sources beside
# them wrapped as core.runtime.cuda wraps them, and `cuobjdump -sass` on the cubin.
HANDWRITTEN = {  # name: registers, stack frame, shared memory, (wide, narrow) loads, matrix ops
    "local_array": (16, 256, 0, (0, 1), []),
    "narrow": (10, 0, 1024, (0, 1), []),
    "wide": (14, 0, 0, (1, 0), []),
    "tensor_core": (18, 0, 0, (0, 6), ["HMMA.16816.F32"]),
}
PRESSURE = {"registers": 32, "stack_bytes": 424, "spill_store_bytes": 952,
            "spill_load_bytes": 956}


def test_ptxas_figures_of_every_entry_kernel():
    kernels = parse_ptxas((DATA / "handwritten.ptxas.txt").read_text())
    assert sorted(kernels) == sorted(HANDWRITTEN)
    for name, (registers, stack, shared, _, _) in HANDWRITTEN.items():
        kernel = kernels[name]
        got = (kernel.registers, kernel.stack_bytes, kernel.shared_bytes,
               kernel.spill_store_bytes, kernel.spill_load_bytes)
        assert got == (registers, stack, shared, 0, 0), f"{name}: {got}"


def test_ptxas_spill_stores_and_loads():
    (kernel,) = parse_ptxas((DATA / "pressure.ptxas.txt").read_text()).values()
    assert {figure: getattr(kernel, figure) for figure in PRESSURE} == PRESSURE
    assert kernel.local_bytes == 952 + 956


def test_sass_load_widths_and_matrix_opcodes():
    found = parse_sass((DATA / "handwritten.sass.txt").read_text())
    assert sorted(found) == sorted(HANDWRITTEN)
    for name, (*_, loads, matrix) in HANDWRITTEN.items():
        wide, narrow, opcodes = found[name]
        assert (wide, narrow > 0) == (loads[0], loads[1] > 0), f"{name}: {wide} wide, {narrow}"
        assert opcodes == matrix, name
    assert found["tensor_core"][1] == 6


def test_sass_widths_of_each_load_form():
    sass = "\n".join(["\t\tFunction : k", *(
        f"        /*00{i}0*/  {pred}{opcode} R2, desc[UR4][R2.64] ;  /* 0x0 */"
        for i, (pred, opcode) in enumerate([
            ("", "LDG.E.128.CONSTANT"), ("@P0 ", "LDG.E.64"), ("@!P1 ", "LDG.E.U16"),
            ("", "LDGSTS.E.BYPASS.LTC128B.128"), ("", "UTMALDG.2D"), ("", "LDG.E.S8"),
            ("", "HGMMA.64x128x16.F32.BF16"), ("", "STG.E.128")])
    )])
    assert parse_sass(sass) == {"k": (3, 3, ["HGMMA.64x128x16.F32.BF16"])}


def test_ptx_widths_of_each_load_form_and_the_matrix_opcodes():
    body = [
        "@%p1 ld.global.v4.b32 { %r1, %r2, %r3, %r4 }, [ %rd1 + 0 ];",
        "ld.global.L1::evict_last.L2::cache_hint.v2.f32 { %f1, %f2 }, [ %rd2 + 0 ], %rd3;",
        "@!%p2 ld.global.b16 { %rs1 }, [ %rd4 + 0 ];",
        "cp.async.cg.shared.global [ %r5 + 0 ], [ %rd5 + 0 ], 0x10, %r6;",
        "cp.async.ca.shared.global [ %r7 + 0 ], [ %rd6 + 0 ], 4, %r8;",
        "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes "
        "[%r9], [%rd7, {%r10, %r11}], [%r12];",
        "ld.shared.v4.b32 { %r13, %r14, %r15, %r16 }, [ %r17 + 0 ];",
        "st.global.v4.b32 [ %rd8 + 0 ], { %r1, %r2, %r3, %r4 };",
        "wgmma.fence.sync.aligned;",
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {%f3}, %rd9, %rd10, p, 1, 1;",
        "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%f4}, {%r18}, {%r19}, {%f5};"]
    ptx = "\n".join([".visible .entry k(", "\t.param .u64 k_param_0", ")", "{",
                     *(f"\t{line}" for line in body), "}", ".visible .entry other(", "{",
                     "\tld.global.nc.v4.f32 { %f6 }, [ %rd11 ];", "}"])
    assert parse_ptx(ptx) == {
        "k": (3, 3, ["mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32",
                     "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16"]),
        "other": (1, 0, [])}


SCALED = """import triton
import triton.language as tl


@triton.jit
def scaled(source, target, n, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    tl.store(target + offsets, tl.load(source + offsets, mask=mask) * 2.0, mask=mask)
"""


@pytest.fixture(scope="module")
def compiled_ptx(tmp_path_factory) -> dict[str, dict]:
    path = tmp_path_factory.mktemp("ptx") / "scaled.py"
    path.write_text(SCALED)
    signature = {"source": "*fp32", "target": "*fp32", "n": "i32", "BLOCK": "constexpr"}
    return compile_for_sm90(path, [
        {"name": str(aligned), "kernel": "scaled", "signature": signature,
         "constexprs": {"BLOCK": 1024}, "aligned": [0, 1, 2] if aligned else []}
        for aligned in (True, False)])


@pytest.mark.parametrize("aligned,wide", [(True, True), (False, False)])
def test_triton_ptx_compiled_here_shows_its_vector_loads(aligned, wide, compiled_ptx):
    """Compiled for sm_90 with no GPU: pointers known 16-byte aligned load 16 bytes at once."""
    compiled = compiled_ptx[str(aligned)]
    wide_loads, narrow_loads, matrix = parse_ptx(compiled["ptx"])[compiled["name"]]
    assert (wide_loads > 0, narrow_loads > 0, matrix) == (wide, not wide, []), \
        (wide_loads, narrow_loads)


def test_real_tools_give_the_recorded_figures():
    source = (DATA / "handwritten.cu").read_text()
    report = cuda_source_report(source)
    assert report.notes == []
    by_name = {kernel.name: kernel for kernel in report.kernels}
    for name, (registers, stack, shared, (wide, narrow), matrix) in HANDWRITTEN.items():
        kernel = by_name[name]
        assert (kernel.registers, kernel.stack_bytes, kernel.shared_bytes) == \
            (registers, stack, shared), name
        assert (kernel.wide_loads, kernel.narrow_loads > 0, kernel.matrix_ops) == \
            (wide, narrow > 0, matrix), name
        assert kernel.sources["registers"].startswith("ptxas -v")
        assert kernel.sources["loads"] == "cuobjdump -sass"
    (spilling,) = cuda_source_report((DATA / "pressure.cu").read_text()).kernels
    assert spilling.spill_store_bytes > 0 and spilling.spill_load_bytes > 0, spilling


def test_a_source_nvcc_rejects_leaves_a_note():
    report = cuda_source_report("__global__ void broken(float* x) { x[0] = undeclared; }")
    assert report.kernels == []
    (note,) = report.notes
    assert note.startswith("nvcc failed") and "undeclared" in note


@pytest.fixture(scope="module")
def generated(tmp_path_factory) -> dict[str, KernelReport]:
    """Rules-generator CUDA, compiled in parallel: 16- and 8-byte pointwise vectors (fp32) and
    a softmax whose rows span 16 warps (so it reduces through shared memory)."""
    folder = tmp_path_factory.mktemp("generated")
    (folder / "pw").mkdir()
    (folder / "sm").mkdir()
    pointwise = load_site_graph(one_input_problem(folder / "pw", "torch.relu(x * 2.0 + 1.0)",
                                        "torch.randn(64, 128)"))
    softmax = load_site_graph(one_input_problem(folder / "sm", "torch.softmax(x, -1)",
                                      "torch.randn(8, 4096)"))
    candidates = {
        "vector16": write_cuda_pointwise(pointwise, CudaPointwiseConfig(vector_bytes=16)),
        "vector8": write_cuda_pointwise(pointwise, CudaPointwiseConfig(vector_bytes=8)),
        "softmax": write_cuda_reduction(softmax, CudaReductionConfig(threads=512)),
    }
    sources = {name: cuda_sources(text)[0] for name, text in candidates.items()}
    with ThreadPoolExecutor(max_workers=3) as pool:
        return dict(zip(sources, pool.map(cuda_source_report, sources.values()), strict=True))


def test_generated_pointwise_vector_width_shows_in_the_loads(generated):
    for name, wide in (("vector16", True), ("vector8", False)):
        report = generated[name]
        kernels = {kernel.name: kernel for kernel in report.kernels}
        assert sorted(kernels) == ["pointwise_rows", "pointwise_vector"], report
        vector = kernels["pointwise_vector"]
        assert (vector.wide_loads > 0) is wide and (vector.narrow_loads > 0) is not wide, vector
        assert 0 < vector.registers <= 255 and vector.local_bytes == 0, vector
        assert vector.shared_bytes == 0 and vector.matrix_ops == []


def test_generated_softmax_reduces_through_shared_memory(generated):
    (kernel,) = generated["softmax"].kernels
    assert kernel.name == "row_softmax"
    assert kernel.shared_bytes > 0 and kernel.registers > 0 and kernel.local_bytes == 0, kernel


def test_a_report_round_trips_through_a_dict():
    report = KernelReport([KernelStats("k", registers=40, stack_bytes=8, threads=128,
                                       wide_loads=2, narrow_loads=0, matrix_ops=["HMMA.16816.F32"],
                                       sources={"registers": "Triton n_regs"})], ["a note"])
    assert KernelReport.from_dict(report.to_dict()) == report
    assert report.largest("registers") == 40 and report.largest("shared_bytes") is None


def test_triton_under_the_interpreter_has_no_compiled_metadata(tmp_path):
    assert "triton" in sys.modules and not torch.cuda.is_available()
    graph = load_site_graph(one_input_problem(tmp_path, "torch.relu(x)", "torch.randn(32)"))
    source = write_compiled(graph, Schedule(1, 1024, 4))
    path = tmp_path / "candidate.py"
    path.write_text(source)
    report = candidate_report(import_file(path, "kernel_report_candidate"), source)
    assert report == KernelReport(notes=[INTERPRETER_NOTE])


def test_the_verdict_carries_the_report_and_an_empty_diagnosis_on_a_cpu(tmp_path):
    path = one_input_problem(tmp_path, "torch.sigmoid(x) * x", "torch.randn(16, 64)")
    source = write_compiled(load_site_graph(path), Schedule(1, 1024, 4))
    verdict = evaluate(path, source, EvalConfig(device="cpu"))
    assert verdict.correct, verdict.reason
    assert verdict.kernel_report == {"kernels": [], "notes": [INTERPRETER_NOTE]}
    assert verdict.diagnosis == ""  # no compiled figures, and CPU latencies have no GPU floor


def test_verdicts_stored_before_the_report_still_load():
    old = Verdict(accepted=True, latency_ms=1.0).to_dict()
    del old["kernel_report"], old["diagnosis"]
    verdict = Verdict.from_dict(old)
    assert verdict.kernel_report is None and verdict.diagnosis == ""
    new = Verdict(kernel_report=KernelReport([KernelStats("k", registers=32)]).to_dict(),
                  diagnosis="spilling: k: a 16-byte stack frame per thread at 32 registers")
    assert Verdict.from_json(new.to_json()) == new


@pytest.mark.gpu
def test_triton_on_a_gpu_reports_its_compiled_kernels(tmp_path):
    path = one_input_problem(tmp_path, "torch.relu(x * 2.0)", "torch.randn(4096, 4096)")
    source = write_compiled(load_site_graph(path), Schedule(1, 4096, 8))
    verdict = evaluate(path, source, EvalConfig(device="cuda"))
    assert verdict.correct, verdict.reason
    report = KernelReport.from_dict(verdict.kernel_report)
    assert report.kernels, report
    for kernel in report.kernels:
        assert kernel.registers and kernel.threads == 256 and kernel.stack_bytes is not None
        assert kernel.wide_loads is not None, report.notes
    assert verdict.diagnosis, verdict
