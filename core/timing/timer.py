"""Timing a callable on the CPU or a CUDA device: warm-up, many trials, the median.

On CUDA every trial is bracketed by events recorded on the current stream and the device is
synchronized before the events are read, so asynchronous work cannot escape the timer.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class TimingStats:
    """Latencies of one callable in milliseconds; `device` says what clock measured them."""

    median_ms: float
    mean_ms: float
    min_ms: float
    max_ms: float
    stdev_ms: float
    trials: int
    device: str

    @staticmethod
    def from_samples(samples_ms: list[float], device: str) -> TimingStats:
        if not samples_ms:
            raise ValueError("no timing samples")
        return TimingStats(
            median_ms=statistics.median(samples_ms),
            mean_ms=statistics.fmean(samples_ms),
            min_ms=min(samples_ms),
            max_ms=max(samples_ms),
            stdev_ms=statistics.pstdev(samples_ms),
            trials=len(samples_ms),
            device=device,
        )


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_callable(
    fn: Callable[[], object],
    device: torch.device,
    warmup: int = 3,
    trials: int = 20,
    before_each: Callable[[], object] | None = None,
) -> TimingStats:
    """Median-of-trials latency of `fn()`; `before_each` runs untimed before every trial."""
    for _ in range(warmup):
        if before_each is not None:
            before_each()
        fn()
    synchronize(device)
    samples: list[float] = []
    for _ in range(trials):
        if before_each is not None:
            before_each()
        samples.append(time_once(fn, device))
    return TimingStats.from_samples(samples, device.type)


def time_once(fn: Callable[[], object], device: torch.device) -> float:
    """Milliseconds of one call of `fn()`, device work included."""
    if device.type == "cuda":
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        # A device-wide sync, not just the end event: work escaping to another stream is
        # waited for too (and shows up as a slow next trial rather than a fast one).
        torch.cuda.synchronize(device)
        return start.elapsed_time(end)
    begin = time.perf_counter()
    fn()
    return (time.perf_counter() - begin) * 1e3
