"""One searched site during a run: its tree, its verdicts, and the PyTorch time to beat."""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from pathlib import Path

from core.evaluate import Verdict
from core.optimize.e2e import SiteGain
from core.profile.sites import Site
from core.runtime.guarded import SiteKernel
from core.search.tree import SiteSearch
from generators.base import Feedback


@dataclass(eq=False)
class SiteRun:
    site: Site
    site_id: int
    search: SiteSearch
    tiers: tuple[str, ...]
    verdicts: dict[int, Verdict] = field(default_factory=dict)  # by id() of the proposal
    stored: dict[int, Verdict] = field(default_factory=dict)  # by candidate id
    profiled: set[int] = field(default_factory=set)  # candidate ids with counters
    eager_samples: list[float] = field(default_factory=list)  # the site's eager times, ms
    compile_ms: float | None = None
    steps: int = 0  # batches of its search judged whole in this run

    @property
    def problem(self) -> Path:
        """The site problem its candidates are judged on."""
        return self.site.folder / "problem.py"

    @property
    def eager_ms(self) -> float | None:
        """The low median of the site's eager times: noise only ever adds time, so of the
        two middle ones the lower, and one slow measurement cannot set it."""
        return statistics.median_low(self.eager_samples) if self.eager_samples else None

    def note_baseline(self, eager_ms: float | None, compile_ms: float | None = None) -> None:
        """One more measurement of the site's PyTorch times; kernels are measured against the
        faster of eager and compiled.

        The site's own timing (`core.evaluate.site_baseline`) and every verdict, which times
        the site beside its kernel, each add an eager time, and the search's baseline is
        revised with each: the first alone (a cold worker's, say) can be many times the
        site's real time, and every speedup measured against it as inflated.
        """
        if compile_ms is not None:
            self.compile_ms = compile_ms
        if eager_ms:
            self.eager_samples.append(eager_ms)
        times = [t for t in (self.eager_ms, self.compile_ms) if t]
        if times and min(times) != self.search.baseline_ms:
            self.search.rebase(min(times))

    @property
    def winner(self) -> SiteGain | None:
        """The site's best kernel, if it beats the site's baseline."""
        best = self.search.best
        if best is None or best.latency_ms >= self.search.baseline_ms or not self.eager_ms:
            return None
        kernel = SiteKernel(self.site.key, best.proposal.source, self.site.problem.source)
        return SiteGain(kernel, self.site.time_ms, self.eager_ms / best.latency_ms)

    def at_floor_note(self) -> str | None:
        """Why the site is not searched when PyTorch already runs it near the GPU's byte floor
        (`SiteSearch.at_floor`); None otherwise."""
        search = self.search
        if not search.at_floor or search.evaluations or search.best is not None:
            return None
        share = search.floor_ms / search.baseline_ms
        return (f"{self.site.key}: PyTorch already runs at {share:.0%} of the GPU's byte floor "
                f"({search.baseline_ms:.4f} ms against {search.floor_ms:.4f}): left to PyTorch, "
                "no kernel could gain much")

    @property
    def headroom(self) -> float:
        """How far above its floor the site's best is, in (0, 1]."""
        floor = self.site.cost.floor_ms
        best = self.search.best_ms
        return max(0.0, 1.0 - floor / best) if best > 0 else 0.0


    def result(self) -> dict[str, object]:
        """The site's search, as the run's result reports it."""
        best = self.search.best
        baseline = self.search.baseline_ms
        return {
            "id": self.site.key,
            "evaluations": self.search.evaluations,
            # Why the generator wrote nothing at all; once it has, running out of drafts is
            # the normal end of the root's widening, not news.
            "declined": self.search.declined if self.search.evaluations == 0 else "",
            "eager_ms": self.eager_ms,
            "compile_ms": self.compile_ms,
            "best": {
                "candidate_id": best.candidate_id if best else None,
                "tier": best.proposal.tier if best else "torch",
                "latency_ms": best.latency_ms if best else baseline,
                "speedup": baseline / best.latency_ms if best else 1.0,
                "speedup_vs_eager": (self.eager_ms / best.latency_ms if best and self.eager_ms
                                     else 1.0),
                "depth": best.depth if best else 0,
            },
        }


def with_best(record: dict, runs: list[SiteRun]) -> dict[str, object]:
    """A site of the profile's report, with its search's result where it was searched."""
    searched = next((r for r in runs if r.site.key == record["id"]), None)
    if searched is None:
        return {**record, "best": {"candidate_id": None, "tier": "torch",
                                   "latency_ms": None, "speedup": 1.0}}
    return {**record, **searched.result()}


def headroom_ms(time_ms: float | None, floor_ms: float | None) -> float:
    """What a site could gain: its time scaled by how far it sits above its floor."""
    time_ms, floor_ms = time_ms or 0.0, floor_ms or 0.0
    return time_ms * (1 - floor_ms / max(time_ms, 1e-9))


def site_priority(run: SiteRun, total_ms: float) -> tuple[bool, float]:
    """Which open site the search steps next: sites not stepped yet first, then the largest
    expected gain. At real sizes one step can take minutes (a few GB-sized candidates judged);
    by gain alone the first site could spend a whole budget while a site with room to gain got
    no kernel at all."""
    share = run.site.time_ms / total_ms if total_ms > 0 else 0.0
    gain = share * max(run.headroom, 1e-3) / math.sqrt(1 + run.search.evaluations)
    return run.steps == 0, gain


def feedback_of(verdict: Verdict, floor_ms: float, diagnosis: bool = True) -> Feedback:
    return Feedback(correct=verdict.correct, reason=verdict.reason,
                    latency_ms=verdict.latency_ms, baseline_ms=verdict.baseline_ms,
                    floor_ms=floor_ms, compile_log=verdict.compile_log,
                    diagnosis=verdict.diagnosis if diagnosis else "")
