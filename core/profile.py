"""Where the time goes: the whole model's latency and each site's in-situ share of it.

The model is timed eagerly, unmarked, alternating with the marked forwards. In-situ site times
come from the captured model, whose graphs carry a mark between consecutive segments: a
segment's time is the gap between its two marks, measured inside a real forward (real cache
state, real neighbours). What no site owns
(views, ops kept with PyTorch, Python between graphs) is reported as kept, so the parts add up
to the instrumented forward.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass

import torch

from core.capture import Capture, Mark
from core.load import LoadedModel
from core.sites import SiteTable
from core.timing import TimingStats, synchronize, time_once

_OUTSIDE = -1  # the graph index of the marks around a whole forward


@dataclass(frozen=True)
class ProfileConfig:
    warmup: int = 3
    trials: int = 20


@dataclass
class Profile:
    device_label: str
    model: TimingStats  # eager, unmarked
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
    trials: list[dict[str, float]] = []
    eager_ms: list[float] = []
    total = config.warmup + config.trials
    with torch.no_grad():
        for i in range(total):
            # Eager and marked forwards alternate, so both see the same machine state.
            eager = time_once(lambda: loaded.model(*loaded.inputs), device)
            recorder.marks.clear()
            recorder.active = True
            recorder.mark(_OUTSIDE, 0)
            capture.compiled(*loaded.inputs)
            recorder.mark(_OUTSIDE, 1)
            recorder.active = False
            synchronize(device)
            if i >= config.warmup:
                eager_ms.append(eager)
                trials.append(_one_trial(list(recorder.marks),
                                         lambda g, k: owners.get((g, k))))
            progress(i + 1, total)
    recorder.marks.clear()

    def median(key: str) -> float:
        return statistics.median(t.get(key, 0.0) for t in trials)

    site_ms = {site.key: median(site.key) for site in table.sites}
    for site in table.sites:
        site.time_ms = site_ms[site.key]
    instrumented = statistics.median(sum(t.values()) for t in trials)
    model_stats = TimingStats.from_samples(eager_ms, device.type)
    return Profile(device_label(device), model_stats, instrumented, median("kept"),
                   median("outside"), site_ms)
