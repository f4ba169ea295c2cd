"""Shares kept in registers: a kernel's later walks compute their offsets again rather than
carry the first walk's across the exchange, and the kernel asks ptxas for the blocks an SM its
share leaves room for, so that the registers a thread takes are its share and little more, and
as many blocks fit an SM as the cluster norm writer fits (ptxas's own count, by the real
nvcc)."""

from __future__ import annotations

import re

from core.evaluate.kernel_report import cuda_source_report, cuda_sources
from generators.compiler.schedule import Schedule
from generators.cuda.program import write_cuda_compiled
from generators.site_graph import load_site_graph
from tests.kernel_checks import one_input_problem

BATCH_NORM = "F.batch_norm(x, None, None, w, b, training=True)"
# Batch norm's channels of 32 × 56² shared by 8 blocks of 320 threads, 40 values a thread in
# registers: the cluster norm writer's best setting for it (bench/results/rules_generator_h200.md).
WRITERS_SETTING = Schedule(1, 12800, 10, cluster_blocks=8, keep_row=True, held="registers",
                           vector=4)


GROUP_NORM = "F.silu(F.group_norm(x, 32, w, b))"
# Group norm's groups of 16 × 64² shared by 8 blocks of 128 threads, 64 values a thread.
GROUP_SETTING = Schedule(1, 8192, 4, cluster_blocks=8, keep_row=True, held="registers",
                         vector=4)


def _source(tmp_path) -> str:
    problem = one_input_problem(tmp_path, BATCH_NORM, "torch.randn(32, 256, 56, 56), "
                                "torch.randn(256), torch.randn(256)", "x, w, b")
    return write_cuda_compiled(load_site_graph(problem), WRITERS_SETTING)


def _kernel(source: str):
    (cuda,) = cuda_sources(source)
    report = cuda_source_report(cuda)
    assert report.notes == [], report.notes
    (kernel,) = [k for k in report.kernels if "site_kernel" in k.name]
    return kernel


def test_the_later_walk_computes_its_offsets_again(tmp_path):
    kernel = _source(tmp_path).split("__global__")[1]
    opaque = re.findall(r'asm volatile\(""\s*:\s*"\+r"\((start\d+)\)\);', kernel)
    assert len(opaque) == 1, kernel
    first, later = kernel.split(f'asm volatile("" : "+r"({opaque[0]}));')
    assert "kept0[" in first and "load_vector<float4>(&in0[" in first
    assert f"= {opaque[0]} + " in later and "store_vector(&out0[" in later


def test_three_blocks_of_320_threads_fit_an_sm(tmp_path):
    # 65536 registers an SM over 3 × 320 threads: at most 64 a thread (the writer's own count).
    source = _source(tmp_path)
    assert "__launch_bounds__(320, 3)" in source
    kernel = _kernel(source)
    assert kernel.registers <= 64 and not kernel.spill_store_bytes, kernel


def test_six_blocks_of_128_threads_keeping_64_values_fit_an_sm(tmp_path):
    # 64 values and 16 registers more a thread: 6 blocks of 128 threads, 80 registers a thread
    # (the cluster norm writer's count) and nothing spilled, where ptxas left free takes more
    # and fits 5.
    problem = one_input_problem(tmp_path, GROUP_NORM, "torch.randn(16, 512, 64, 64), "
                                "torch.randn(512), torch.randn(512)", "x, w, b")
    source = write_cuda_compiled(load_site_graph(problem), GROUP_SETTING)
    assert "__launch_bounds__(128, 6)" in source
    kernel = _kernel(source)
    assert kernel.registers <= 80 and not kernel.spill_store_bytes, kernel
