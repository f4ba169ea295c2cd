"""Where the time goes: the whole model's latency and each site's in-situ share of it.

Forwards of three kinds take turns in every trial, in an order that rotates from trial to
trial (whichever runs first finds the caches its predecessor left), so all see the same
machine state:
- the eager model, unmarked: its time on the device, and its latency with launches;
- the captured program (the graphs Kiln cut into sites), unmarked: what the sites add up to.
  It can differ from eager: libraries take other paths under torch.compile;
- the captured program with a mark between consecutive segments: a segment's time is the gap
  between its two marks, inside a real forward (real cache state, real neighbours).

On a GPU the timed forwards are queued behind a sleep kernel long enough for the CPU to
enqueue the whole forward first, so times are the GPU's own, not inflated by launch gaps. The
marks themselves still cost time inside every gap (on a GPU the event recorded between two
kernels, on the CPU the call that reads the clock), which made the parts of small models
add up to a fifth or a third more than the program (bench/NOTES.md, profiler accounting on
small models). That cost is measured on the program itself: the marked forward less the
unmarked one (the same trials, in turns), over the gaps a forward has, is what one mark adds
to the gap it closes, and it is taken out of every gap. (Measured instead between tiny ops,
a mark cost less than between a real program's kernels: bench/NOTES.md, list-sites of
2026-12-05, 17:00-17:33 UTC.) The
eager latency with launches (the sleep left out) is reported beside the times: a model whose
eager latency is far above its device time is bound by Python and launches, which kernels
alone do not fix. What no site owns (views, ops kept with PyTorch, Python between graphs) is
reported as kept, so the parts add up to the captured program.
"""

from __future__ import annotations

import statistics
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from itertools import pairwise

import torch

from core.profile.load import LoadedModel
from core.profile.sites import SiteTable
from core.runtime.capture import Capture, Mark
from core.timing.device_lock import device_lock_path, exclusive_device
from core.timing.timer import QueueAhead, TimingStats, synchronize, time_once

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
    instrumented_ms: float  # median marked forward, the marks' own cost included
    mark_ms: float  # what a mark adds to the gap it closes, taken out of every gap
    kept_ms: float  # inside graphs, owned by no site
    outside_ms: float  # between graphs: Python, graph breaks, guards
    site_ms: dict[str, float]

    @property
    def total_ms(self) -> float:
        return self.model.median_ms

    @property
    def accounted_ms(self) -> float:
        return sum(self.site_ms.values()) + self.kept_ms + self.outside_ms


@contextmanager
def steady_threads(device: torch.device) -> Iterator[None]:
    """On the CPU, one intra-op thread. With several, an op waits for whichever of its threads
    the OS has set aside, and on a loaded machine the same forward took its time or tens of
    times more, from trial to trial; the GPU's timings are left alone. Around the compiling
    too, not the timing alone: torch.compile's guards hold the thread count, so a change
    between the two compiles the model anew, and the graphs timed are not those captured."""
    if device.type != "cpu":
        yield
        return
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def device_label(device: torch.device) -> str:
    if device.type == "cuda":
        return f"{torch.cuda.get_device_name(device)} (CUDA events)"
    return "CPU (wall clock; CPU timings, not GPU)"


def _elapsed_ms(first: Mark, mark: Mark) -> float:
    if first.event is not None:
        return first.event.elapsed_time(mark.event)
    return (mark.clock_ns - first.clock_ns) / 1e6


# The time between two consecutive marks: who owns it (a site key, 'kept' or 'outside'), and
# how many milliseconds it lasted.
Gap = tuple[str, float]


def _gaps(marks: list[Mark], owner: Callable[[int, int], str | None]) -> list[Gap]:
    """The gaps between consecutive marks of one forward, each with its owner."""
    gaps = []
    for prev, mark in pairwise(marks):
        segment = mark.graph == prev.graph != _OUTSIDE and mark.boundary == prev.boundary + 1
        who = (owner(mark.graph, prev.boundary) or "kept") if segment else "outside"
        gaps.append((who, _elapsed_ms(prev, mark)))
    return gaps


def _by_owner(gaps: list[Gap], mark_ms: float) -> dict[str, float]:
    """One forward's time by owner, each gap less the cost of the mark that closes it."""
    result: dict[str, float] = defaultdict(float)
    for who, ms in gaps:
        result[who] += max(0.0, ms - mark_ms)
    return result


def _typical(trials: list[dict[str, float]]) -> dict[str, float]:
    """Each owner's mean over the middle half of the forwards, ranked by their whole time.

    A forward slowed as a whole is left out whole, and the parts still add up to a typical
    forward, which the parts' own medians do not: their spreads are lopsided, and on a loaded
    CPU they came to 12 % under the program.
    """
    ranked = sorted(trials, key=lambda trial: sum(trial.values()))
    cut = len(ranked) // 4
    middle = ranked[cut:len(ranked) - cut]
    owners = set().union(*middle)
    return {who: statistics.fmean(trial.get(who, 0.0) for trial in middle) for who in owners}


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

    def marked_run(body: Callable[[], object]) -> list[Mark]:
        """The marks of one queued run of `body`, between a first and a last mark."""
        recorder.marks.clear()
        queue()
        recorder.active = True
        recorder.mark(_OUTSIDE, 0)
        body()
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

    def marked() -> float:
        marks = marked_run(captured)
        forwards.append(_gaps(marks, lambda g, k: owners.get((g, k))))
        return _elapsed_ms(marks[0], marks[-1])

    measures: dict[str, Callable[[], float]] = {
        "latency": lambda: time_once(eager, device), "eager": lambda: queued(eager),
        "captured": lambda: queued(captured), "marked": marked}
    names = list(measures)
    samples: dict[str, list[float]] = {name: [] for name in names}
    forwards: list[list[Gap]] = []
    total = config.warmup + config.trials
    # Other Kiln processes on this machine wait while the forwards are timed.
    with torch.no_grad(), exclusive_device(device_lock_path(device.type)):
        queue.fit(max(_enqueue_ms(eager, device), _enqueue_ms(captured, device)))
        for i in range(total):
            turn = i % len(names)
            times = {name: measures[name]() for name in names[turn:] + names[:turn]}
            if i >= config.warmup:
                for name, value in times.items():
                    samples[name].append(value)
            progress(i + 1, total)
    recorder.marks.clear()
    forwards = forwards[config.warmup:]

    mark_ms = mark_cost(statistics.median(samples["marked"]),
                        statistics.median(samples["captured"]), forwards)
    parts = _typical([_by_owner(gaps, mark_ms) for gaps in forwards])
    site_ms = {site.key: parts.get(site.key, 0.0) for site in table.sites}
    for site in table.sites:
        site.time_ms = site_ms[site.key]
    stats = {name: TimingStats.from_samples(samples[name], device.type)
             for name in ("eager", "latency", "captured")}
    return Profile(device_label(device), stats["eager"], stats["latency"], stats["captured"],
                   statistics.median(samples["marked"]), mark_ms, parts.get("kept", 0.0),
                   parts.get("outside", 0.0), site_ms)


def mark_cost(marked_ms: float, captured_ms: float, forwards: list[list[Gap]]) -> float:
    """What one mark adds to the gap it closes, in this program: the marked forward's excess
    over the unmarked one, shared by its gaps (each closed by one mark); never negative."""
    gaps = statistics.median(len(forward) for forward in forwards) if forwards else 0
    return max(0.0, (marked_ms - captured_ms) / gaps) if gaps else 0.0


def _enqueue_ms(forward: Callable[[], object], device: torch.device) -> float:
    """CPU time to issue one forward (the device catches up afterwards)."""
    synchronize(device)
    begin = time.perf_counter()
    forward()
    elapsed = (time.perf_counter() - begin) * 1e3
    synchronize(device)
    return elapsed
