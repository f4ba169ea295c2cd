"""Timing a callable on the CPU or a CUDA device: warm-up, many trials, the median.

On CUDA every trial is bracketed by events recorded on the current stream and the device is
synchronized before the events are read, so asynchronous work cannot escape the timer. With a
`QueueAhead`, a sleep kernel runs ahead of each trial while the CPU issues the call, so the events
bracket the device's work and not the Python that issues it: the evaluator's guard runs Python
around every call of a candidate that the installed kernel never runs (on an H200 the evaluator
timed a GEMM site's kernel well above what it cost the model: bench/NOTES.md, 2026-12-05,
11:50-12:10 UTC), and a site's baseline is timed the same way.
"""

from __future__ import annotations

import statistics
import time
from collections import deque
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


# The longest sleep queued ahead of one call: a call that took longer to issue (the first,
# which compiles) is timed with its Python, and only the calls after it sleep this long.
MAX_QUEUE_MS = 5.0
# The sleep's margin over twice a call's issue time where a call is timed a hundred times over
# (a site's candidate and its baseline): a millisecond each would add a tenth of a second to
# every evaluation.
SITE_QUEUE_MARGIN_MS = 0.25
_CYCLES_PER_MS: dict[torch.device, float] = {}


class QueueAhead:
    """Keeps a GPU busy while the CPU issues a call, so that the timer's events bracket the
    call's device work, not the launches' Python. The sleep lasts twice the longest time a
    recent call took to issue (`observe`) or a time given (`fit`), plus `margin_ms` for the
    CPU's jitter; on the CPU it does nothing. The sleep kernel counts clock cycles: each sleep
    is timed too (`clocked`), and the fastest clock seen sizes the next, since a GPU measured
    idle runs its first sleeps at a fraction of its clock."""

    def __init__(self, device: torch.device, margin_ms: float = 1.0) -> None:
        self.device = device
        self.enabled = device.type == "cuda"
        self.margin_ms = margin_ms
        self.sleep_ms = 0.0
        self.recent: deque[float] = deque(maxlen=5)
        self.cycles_per_ms = _cycles_per_ms(device) if self.enabled else 0.0

    @property
    def sleep_cycles(self) -> int:
        return int(self.sleep_ms * self.cycles_per_ms)

    def fit(self, enqueue_ms: float) -> None:
        """Sleep long enough for a call that takes `enqueue_ms` to issue."""
        self.sleep_ms = 2 * enqueue_ms + self.margin_ms

    def observe(self, enqueue_ms: float) -> None:
        """A call took `enqueue_ms` of the CPU's time to issue: sleep long enough for the
        slowest of the last few, up to `MAX_QUEUE_MS`."""
        self.recent.append(enqueue_ms)
        self.sleep_ms = min(2 * max(self.recent) + self.margin_ms, MAX_QUEUE_MS)

    def clocked(self, cycles: int, elapsed_ms: float) -> None:
        """A sleep of `cycles` took `elapsed_ms` on the device."""
        if cycles and elapsed_ms > 0 and cycles / elapsed_ms > self.cycles_per_ms:
            self.cycles_per_ms = _CYCLES_PER_MS[self.device] = cycles / elapsed_ms

    def __call__(self) -> int:
        """Queue the sleep; the cycles it lasts."""
        cycles = self.sleep_cycles if self.enabled else 0
        if cycles:
            torch.cuda._sleep(cycles)
        return cycles


def _cycles_per_ms(device: torch.device) -> float:
    """The sleep kernel's clock cycles a millisecond on `device`, measured once a process."""
    if device not in _CYCLES_PER_MS:
        probe = 2_000_000
        _CYCLES_PER_MS[device] = probe / time_once(lambda: torch.cuda._sleep(probe), device)
    return _CYCLES_PER_MS[device]


def time_callable(
    fn: Callable[[], object],
    device: torch.device,
    warmup: int = 3,
    trials: int = 20,
    before_each: Callable[[], object] | None = None,
    queue: QueueAhead | None = None,
) -> TimingStats:
    """Median-of-trials latency of `fn()`; `before_each` runs untimed before every trial; with
    `queue`, each trial's device time without the Python that issues it."""
    warm_up(fn, device, warmup, before_each=before_each, queue=queue)
    samples: list[float] = []
    for _ in range(trials):
        if before_each is not None:
            before_each()
        samples.append(time_once(fn, device, queue))
    return TimingStats.from_samples(samples, device.type)


def warm_up(fn: Callable[[], object], device: torch.device, calls: int, ms: float = 0.0,
            before_each: Callable[[], object] | None = None,
            queue: QueueAhead | None = None) -> float:
    """`calls` calls of `fn()` or `ms` of wall-clock time of them, whichever lasts longer, each
    after `before_each` and each one's issue time told to `queue`; the device synchronized
    after. The wall milliseconds a call took (0.0 when none ran)."""
    begin, warmed = time.perf_counter(), 0
    while warmed < calls or (time.perf_counter() - begin) * 1e3 < ms:
        if before_each is not None:
            before_each()
        issued = time.perf_counter()
        fn()
        if queue is not None:
            queue.observe((time.perf_counter() - issued) * 1e3)
        warmed += 1
    synchronize(device)
    return (time.perf_counter() - begin) * 1e3 / warmed if warmed else 0.0


def time_once(fn: Callable[[], object], device: torch.device,
              queue: QueueAhead | None = None) -> float:
    """Milliseconds of one call of `fn()`, device work included (with `queue`: on CUDA, the
    call queued behind a sleep, so the Python that issues it is left out)."""
    if device.type == "cuda":
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        slept, cycles = None, 0
        if queue is not None:
            slept = torch.cuda.Event(enable_timing=True)
            slept.record()
            cycles = queue()
        start.record()
        began = time.perf_counter()
        fn()
        if queue is not None:
            queue.observe((time.perf_counter() - began) * 1e3)
        end.record()
        # A device-wide sync, not just the end event: work escaping to another stream is
        # waited for too (and shows up as a slow next trial rather than a fast one).
        torch.cuda.synchronize(device)
        if slept is not None:
            queue.clocked(cycles, slept.elapsed_time(start))
        return start.elapsed_time(end)
    begin = time.perf_counter()
    fn()
    return (time.perf_counter() - begin) * 1e3
