"""Diagnosis rules: each code from the figures that call for it, with its numbers in the line."""

from __future__ import annotations

import pytest
import torch

from core.evaluate.diagnosis import (
    CODES,
    LATENCY_BOUND,
    NARROW_LOADS,
    NEAR_FLOOR_CODE,
    REGISTER_LIMITED,
    SHARED_LIMITED,
    SPILLING,
    Diagnosis,
    diagnose,
    diagnosis_code,
    moved_bytes,
    occupancy,
)
from core.evaluate.kernel_report import KernelReport, KernelStats
from core.profile.roofline import GpuPeaks


def cuda_kernel(name: str = "k", **figures: object) -> KernelStats:
    """A kernel as ptxas and the SASS describe it: no spills, 16-byte loads unless told."""
    values = {"registers": 32, "spill_store_bytes": 0, "spill_load_bytes": 0, "stack_bytes": 0,
              "shared_bytes": 0, "wide_loads": 4, "narrow_loads": 0}
    return KernelStats(name, **{**values, **figures})


def report(*kernels: KernelStats) -> KernelReport:
    return KernelReport(list(kernels))


def test_near_the_byte_floor():
    found = diagnose(report(cuda_kernel(registers=64)), latency_ms=0.0760, floor_ms=0.0623,
                     baseline_ms=0.0970)
    assert found.code == NEAR_FLOOR_CODE
    assert found.message == ("at 82% of the byte floor (0.0760 ms, floor 0.0623 ms, baseline "
                             "0.0970 ms); 64 registers/thread, no spills")


def test_near_the_floor_outranks_spills():
    spilled = report(cuda_kernel(spill_store_bytes=8, spill_load_bytes=8))
    assert diagnose(spilled, 0.1, 0.09).code == NEAR_FLOOR_CODE
    assert diagnose(spilled, 0.2, 0.09).code == SPILLING


def test_register_spills_with_their_bytes():
    found = diagnose(report(cuda_kernel("pressure", spill_store_bytes=952, spill_load_bytes=956,
                                        stack_bytes=424)), latency_ms=0.50, floor_ms=0.10)
    assert found.code == SPILLING
    assert found.message == ("pressure: 952 bytes of spill stores and 956 of spill loads and a "
                             "424-byte stack frame per thread at 32 registers; at 20% of the "
                             "byte floor (0.5000 ms, floor 0.1000 ms)")


def test_a_local_array_or_triton_local_memory_counts_as_spilling():
    triton = KernelStats("_pointwise", registers=255, stack_bytes=64, threads=128)
    found = diagnose(report(triton), latency_ms=None, floor_ms=None)
    assert found == Diagnosis(SPILLING, "_pointwise: a 64-byte stack frame per thread at 255 "
                                        "registers")


def test_register_limited_occupancy_in_triton_blocks():
    # 168 registers × 32 lanes = 5376 per warp (21 units of 256); 8 warps per block need 43008:
    # one block of 8 warps fits in 65536.
    kernel = KernelStats("_matmul", registers=168, stack_bytes=0, shared_bytes=0, threads=256)
    found = diagnose(report(kernel), latency_ms=0.4, floor_ms=0.1)
    assert found.code == REGISTER_LIMITED
    assert found.message.startswith("_matmul: 168 registers/thread in blocks of 256 threads leave "
                                    "room for 8 of 64 warps per SM (12%); at 25% of the byte")


def test_register_limit_without_a_block_size():
    assert occupancy(cuda_kernel(registers=128)).warps == 16
    assert diagnose(report(cuda_kernel(registers=128)), None, None).code == REGISTER_LIMITED
    # 64 registers leave half the SM's warps: not under the threshold.
    half = occupancy(cuda_kernel(registers=64))
    assert (half.warps, half.limiter, half.fraction) == (32, "registers", 0.5)
    assert diagnose(report(cuda_kernel(registers=64)), None, None) == Diagnosis()


def test_shared_memory_limited_occupancy():
    # 100 KB + 1 KB reserved per block: 2 blocks of 4 warps in 228 KB.
    kernel = KernelStats("_tiles", registers=32, shared_bytes=100 * 1024, threads=128,
                         stack_bytes=0)
    assert occupancy(kernel).limiter == "shared memory"
    found = diagnose(report(kernel), latency_ms=None, floor_ms=None)
    assert found == Diagnosis(SHARED_LIMITED, "_tiles: 102400 bytes of shared memory per block "
                                              "in blocks of 128 threads leave room for 8 of 64 "
                                              "warps per SM (12%)")


def test_small_blocks_are_limited_by_the_block_count_not_reported():
    kernel = KernelStats("_tiny", registers=16, threads=32, stack_bytes=0)
    assert occupancy(kernel).limiter == "blocks" and occupancy(kernel).warps == 32
    assert diagnose(report(kernel), None, None) == Diagnosis()


def test_narrow_loads():
    found = diagnose(report(cuda_kernel("rows", wide_loads=0, narrow_loads=6)), 0.3, 0.1)
    assert found == Diagnosis(NARROW_LOADS, "none of 6 global load instructions moves 16 bytes; "
                                            "32 registers/thread, no spills; at 33% of the "
                                            "byte floor (0.3000 ms, floor 0.1000 ms)")


def test_one_wide_kernel_is_enough():
    kernels = report(cuda_kernel("vector", wide_loads=3), cuda_kernel("rows", wide_loads=0,
                                                                      narrow_loads=6))
    assert diagnose(kernels, 0.3, 0.1).code == LATENCY_BOUND


def test_latency_bound_when_nothing_else_explains_the_gap():
    found = diagnose(report(cuda_kernel(registers=40)), latency_ms=0.5, floor_ms=0.1,
                     baseline_ms=0.4)
    assert found == Diagnosis(LATENCY_BOUND, "at 20% of the byte floor (0.5000 ms, floor "
                                             "0.1000 ms, baseline 0.4000 ms) with 40 "
                                             "registers/thread, no spills")


def test_without_a_report_only_the_floor_speaks():
    assert diagnose(None, 0.5, 0.1).message.endswith("with no compiled-kernel figures")
    assert diagnose(None, 0.1, 0.09).code == NEAR_FLOOR_CODE
    assert diagnose(None, None, 0.1) == Diagnosis() and str(Diagnosis()) == ""


@pytest.mark.parametrize("code", CODES)
def test_the_code_is_read_back_from_the_stored_line(code):
    assert diagnosis_code(str(Diagnosis(code, "at 20% of the byte floor"))) == code


def test_unknown_and_empty_lines_have_no_code():
    assert diagnosis_code("") == "" and diagnosis_code("thermally throttled: who knows") == ""


def test_the_byte_floor_counts_broadcast_inputs_once():
    x = torch.randn(1024, 1024)
    bias = torch.randn(1024).expand(1024, 1024)
    out = (torch.empty(1024, 1024), torch.empty(8, dtype=torch.float16))
    assert moved_bytes([x, bias, 3.0], out) == (4 * 1024 * 1024 + 4 * 1024,
                                                4 * 1024 * 1024 + 2 * 8)


def test_no_kernel_beats_the_impossible_floor_that_copies_and_reads_do_not_reach():
    peaks = GpuPeaks()
    gib = 1 << 30
    # A copy at what the H200 measured (4.18 TB/s) and a read-only kernel at 4.6 TB/s (above
    # the copy figure, as a read-mostly MSELoss was) sit above both floors.
    copy_s, read_only_s = 2 * gib / 4.18e12, gib / 4.6e12
    assert peaks.bytes_seconds(gib, gib) <= copy_s
    assert peaks.impossible_seconds(gib, gib) <= copy_s
    assert peaks.bytes_seconds(gib, 0) <= read_only_s
    # Writes the L2 can hold when the kernel ends are no part of what is impossible.
    assert peaks.impossible_seconds(0, peaks.l2_bytes) == 0.0
