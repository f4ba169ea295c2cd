"""The blocks a process held at its allocator's peak, each with where it was allocated."""

from __future__ import annotations

import torch

from bench.memory_peak import MIB, PeakRecorder


def allocate(mib: int) -> torch.Tensor:
    return torch.empty(mib * MIB, dtype=torch.uint8)


def test_the_peak_lists_the_blocks_held_then_and_their_frames():
    with PeakRecorder("cpu") as recorder:
        kept = allocate(4)
        passing = allocate(8)
        del passing
        later = allocate(2)
    peak = recorder.peak()
    big = [b for b in peak.blocks if b.nbytes >= MIB]
    assert [b.nbytes for b in big] == [8 * MIB, 4 * MIB], peak.report()
    assert 12 * MIB <= peak.nbytes < 13 * MIB
    assert all(any("test_bench_memory_peak.py" in f and "allocate" in f for f in b.frames)
               for b in big), peak.report()
    assert big[1].at_ms <= big[0].at_ms
    report = peak.report()
    assert report.startswith("peak 12 MiB") and "8.0 MiB" in report and "4.0 MiB" in report
    assert kept.numel() and later.numel()


def test_a_recording_without_allocations_of_the_device_is_an_empty_peak():
    with PeakRecorder("cuda") as recorder:
        allocate(1)
    assert recorder.peak().nbytes == 0 and recorder.peak().blocks == []
