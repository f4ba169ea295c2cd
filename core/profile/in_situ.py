"""Where the time goes: the whole model's latency and each site's in-situ share of it.

Forwards of three kinds alternate in every trial, so all see the same machine state:
- the eager model, unmarked: its time on the device, and its latency with launches;
- the captured program (the graphs Kiln cut into sites), unmarked: what the sites add up to.
  It can differ from eager: libraries take other paths under torch.compile;
- the captured program with a mark between consecutive segments: a segment's time is the gap
  between its two marks, inside a real forward (real cache state, real neighbours).

On a GPU the timed forwards are queued behind a sleep kernel long enough for the CPU to
enqueue the whole forward first, so times are the GPU's own, not inflated by launch gaps or
by the extra launches the marks cost. The eager latency with launches (the sleep left out) is
reported beside them: a model whose eager latency is far above its device time is bound by
Python and launches, which kernels alone do not fix. What no site owns (views, ops kept with
PyTorch, Python between graphs) is reported as kept, so the parts add up to the marked
forward.
"""

from __future__ import annotations

import statistics
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass

import torch

from core.profile.load import LoadedModel
from core.profile.sites import SiteTable
from core.runtime.capture import Capture, Mark
from core.timing.device_lock import device_lock_path, exclusive_device
from core.timing.timer import TimingStats, synchronize, time_once

_OUTSIDE = -1  # the graph index of the marks around a whole forward


@dataclass(frozen=True)
class ProfileConfig:
    warmup: int = 3
    trials: int = 20


@dataclass
class Profile:
    device_label: str
    model: TimingStats  # eager, unmarked, device time
    latency: TimingStats  # eager, unmarked, launches included
    captured: TimingStats  # the captured program, unmarked
    instrumented_ms: float  # median marked forward
    kept_ms: float  # inside graphs, owned by no site
    outside_ms: float  # between graphs: Python, graph breaks, guards
    site_ms: dict[str, float]

    @property
    def total_ms(self) -> float:
        return self.model.median_ms

    @property
    def accounted_ms(self) -> float:
        return sum(self.site_ms.values()) + self.kept_ms + self.outside_ms


def device_label(device: torch.device) -> str:
    if device.type == "cuda":
        return f"{torch.cuda.get_device_name(device)} (CUDA events)"
    return "CPU (wall clock; CPU timings, not GPU)"


class QueueAhead:
    """Keeps a GPU busy while the CPU enqueues a forward, so launches never starve it."""

    def __init__(self, device: torch.device) -> None:
        self.enabled = device.type == "cuda"
        self.cycles_per_ms = 0.0
        self.sleep_cycles = 0
        if self.enabled:
            probe = 2_000_000
            self.cycles_per_ms = probe / time_once(lambda: torch.cuda._sleep(probe), device)

    def fit(self, enqueue_ms: float) -> None:
        # Twice the measured enqueue time, plus a millisecond, covers the CPU's jitter.
        self.sleep_cycles = int((2 * enqueue_ms + 1) * self.cycles_per_ms)

    def __call__(self) -> None:
        if self.enabled and self.sleep_cycles:
            torch.cuda._sleep(self.sleep_cycles)


def _elapsed_ms(first: Mark, mark: Mark) -> float:
    if first.event is not None:
        return first.event.elapsed_time(mark.event)
    return (mark.clock_ns - first.clock_ns) / 1e6


def _one_trial(marks: list[Mark], owner: Callable[[int, int], str | None]) -> dict[str, float]:
    """Times of one forward by owner (a site key, 'kept' or 'outside')."""
    times = [_elapsed_ms(marks[0], m) for m in marks]
    result: dict[str, float] = defaultdict(float)
    in_graphs = 0.0
    for i in range(1, len(marks)):
        prev, mark = marks[i - 1], marks[i]
        same_graph = mark.graph == prev.graph != _OUTSIDE
        if same_graph and mark.boundary == prev.boundary + 1:
            result[owner(mark.graph, prev.boundary) or "kept"] += times[i] - times[i - 1]
            in_graphs += times[i] - times[i - 1]
    result["outside"] = times[-1] - in_graphs
    return result


def profile_model(loaded: LoadedModel, capture: Capture, table: SiteTable,
                  config: ProfileConfig, progress: Callable[[int, int], None]) -> Profile:
    device = loaded.device
    owners: dict[tuple[int, int], str] = {}
    for graph in capture.graphs:
        for k, segment in enumerate(graph.segments):
            if segment.region is not None and segment.region in table.site_of:
                owners[(graph.index, k)] = table.site_of[segment.region].key

    recorder = capture.recorder
    queue = QueueAhead(device)

    def marked_forward() -> list[Mark]:
        recorder.marks.clear()
        queue()
        recorder.active = True
        recorder.mark(_OUTSIDE, 0)
        capture.compiled(*loaded.inputs)
        recorder.mark(_OUTSIDE, 1)
        recorder.active = False
        synchronize(device)
        return list(recorder.marks)

    def eager() -> object:
        return loaded.model(*loaded.inputs)

    def captured() -> object:
        return capture.compiled(*loaded.inputs)

    def queued(fn: Callable[[], object]) -> float:
        queue()
        return time_once(fn, device)

    samples: dict[str, list[float]] = {"latency": [], "eager": [], "captured": []}
    trials: list[dict[str, float]] = []
    total = config.warmup + config.trials
    # Other Kiln processes on this machine wait while the forwards are timed.
    with torch.no_grad(), exclusive_device(device_lock_path(device.type)):
        queue.fit(max(_enqueue_ms(eager, device), _enqueue_ms(captured, device)))
        for i in range(total):
            latency = time_once(eager, device)
            times = (latency, queued(eager), queued(captured))
            marks = marked_forward()
            if i >= config.warmup:
                for name, value in zip(samples, times, strict=True):
                    samples[name].append(value)
                trials.append(_one_trial(marks, lambda g, k: owners.get((g, k))))
            progress(i + 1, total)
    recorder.marks.clear()

    def median(key: str) -> float:
        return statistics.median(t.get(key, 0.0) for t in trials)

    site_ms = {site.key: median(site.key) for site in table.sites}
    for site in table.sites:
        site.time_ms = site_ms[site.key]
    instrumented = statistics.median(sum(t.values()) for t in trials)
    stats = {name: TimingStats.from_samples(v, device.type) for name, v in samples.items()}
    return Profile(device_label(device), stats["eager"], stats["latency"], stats["captured"],
                   instrumented, median("kept"), median("outside"), site_ms)


def _enqueue_ms(forward: Callable[[], object], device: torch.device) -> float:
    """CPU time to issue one forward (the device catches up afterwards)."""
    synchronize(device)
    begin = time.perf_counter()
    forward()
    elapsed = (time.perf_counter() - begin) * 1e3
    synchronize(device)
    return elapsed
