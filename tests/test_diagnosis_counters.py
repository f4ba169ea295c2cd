"""Diagnosis with hardware counters: the rules that need them, on counters recorded on an H200
and on made-up ones that call for each code, with the figures in the line."""

from __future__ import annotations

from pathlib import Path

import pytest

from core.evaluate.counters import CounterReport, KernelCounters, parse_ncu_csv
from core.evaluate.diagnosis import (
    COMPUTE_BOUND,
    EXCESS_TRAFFIC,
    LATENCY_BOUND,
    NEAR_FLOOR_CODE,
    REGISTER_LIMITED,
    SPILLING,
    UNCOALESCED,
    Diagnosis,
    diagnose,
)
from core.evaluate.kernel_report import KernelReport, KernelStats

DATA = Path(__file__).parent / "data" / "ncu"
CLEAN = KernelReport([KernelStats("k", registers=32, stack_bytes=0, threads=256,
                                  shared_bytes=0, wide_loads=4, narrow_loads=0)])


def recorded(site: str) -> CounterReport:
    return CounterReport(parse_ncu_csv((DATA / f"{site}.csv").read_text()))


def counters(**figures: object) -> CounterReport:
    values = {"duration_ns": 1000.0, "dram_pct": 20.0, "sm_pct": 20.0,
              "achieved_occupancy_pct": 80.0, "l2_hit_pct": 50.0, "sector_use_pct": 100.0,
              "stalls": {"long_scoreboard": 6.0, "wait": 2.0, "barrier": 2.0}}
    return CounterReport([KernelCounters("k", **{**values, **figures})])


def test_the_recorded_softmax_is_near_its_floor_and_says_what_ncu_saw():
    found = diagnose(CLEAN, latency_ms=0.1292, floor_ms=0.1249, counters=recorded("reduction"))
    assert found.code == NEAR_FLOOR_CODE
    assert found.message.endswith(
        "row_kernel: DRAM 84%, SM 33% of peak, achieved occupancy 69%, L2 hit 51%; warps "
        "stall most on long_scoreboard (47%) and barrier (21%)")


def test_the_recorded_pointwise_is_register_limited_with_the_achieved_occupancy():
    static = KernelReport([KernelStats("pointwise_kernel", registers=73, stack_bytes=0,
                                       threads=256, shared_bytes=0)])
    found = diagnose(static, 0.1035, 0.0624, counters=recorded("pointwise"))
    assert found.code == REGISTER_LIMITED
    assert "leave room for 24 of 64 warps per SM (38%)" in found.message
    assert "achieved occupancy 33%" in found.message


def test_the_recorded_matmul_spills_before_anything_the_counters_say():
    static = KernelReport([KernelStats("matmul_kernel", registers=255, stack_bytes=168,
                                       threads=256)])
    assert diagnose(static, 0.2937, 0.1740, counters=recorded("matmul")).code == SPILLING


def test_uncoalesced_loads_outrank_occupancy():
    crowded = KernelReport([KernelStats("k", registers=200, stack_bytes=0, threads=256)])
    found = diagnose(crowded, 0.5, 0.1, counters=counters(sector_use_pct=25.0))
    assert found.code == UNCOALESCED
    assert found.message.startswith("global loads use 25% of each 32-byte sector they fetch; "
                                    "k: DRAM 20%, SM 20% of peak")
    assert found.message.endswith("at 20% of the byte floor (0.5000 ms, floor 0.1000 ms)")


def test_busy_pipelines_with_idle_memory_are_compute_bound():
    found = diagnose(CLEAN, 0.4, 0.1, counters=counters(sm_pct=85.0, dram_pct=15.0))
    assert found == Diagnosis(COMPUTE_BOUND, "the SM pipelines, not DRAM, are the limit; k: "
                                             "DRAM 15%, SM 85% of peak, achieved occupancy "
                                             "80%, L2 hit 50%; warps stall most on "
                                             "long_scoreboard (60%) and wait (20%); at 25% of "
                                             "the byte floor (0.4000 ms, floor 0.1000 ms)")


def test_busy_memory_far_from_the_floor_moves_too_many_bytes():
    found = diagnose(CLEAN, 0.25, 0.1, counters=counters(dram_pct=88.0))
    assert found.code == EXCESS_TRAFFIC
    assert found.message.startswith("DRAM is busy, yet the kernel runs at 40% of the byte "
                                    "floor: it moves more bytes than the problem needs")


def test_idle_memory_and_pipelines_are_latency_bound_with_the_stalls_named():
    found = diagnose(CLEAN, 0.5, 0.1, counters=counters())
    assert found.code == LATENCY_BOUND
    assert found.message.endswith("warps stall most on long_scoreboard (60%) and wait (20%)")


@pytest.mark.parametrize("empty", [None, CounterReport(notes=["ncu cannot read counters"])])
def test_without_counters_the_static_rules_decide(empty):
    assert diagnose(CLEAN, 0.5, 0.1, counters=empty) == diagnose(CLEAN, 0.5, 0.1)
    assert diagnose(CLEAN, 0.5, 0.1, counters=empty).code == LATENCY_BOUND


def test_counters_speak_even_without_a_timing():
    found = diagnose(CLEAN, None, None, counters=counters(sm_pct=90.0))
    assert found.code == COMPUTE_BOUND and "byte floor" not in found.message
    assert diagnose(CLEAN, None, None, counters=counters()).message.startswith(
        "not timed on a GPU with 32 registers/thread, no spills; k: DRAM 20%")
