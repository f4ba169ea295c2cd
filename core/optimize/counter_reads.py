"""Hardware counters of each site's best kernels, read beside the search's rounds.

After a round of a site's search, its best few kernels without counters are queued
(`CounterReads.queue`); the next round of that site judges them again with Nsight Compute beside
its new candidates, in one `evaluate_many` (a read holds one worker for seconds, which between
rounds would leave the others idle), and `merge` gives each its counters and the diagnosis they
draw. Reads still queued when the search ends are made for every site at once (`flush`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from core.evaluate import Evaluator, Verdict
from core.optimize.site_run import SiteRun
from core.search.best_counters import merge_counters, source_of, unprofiled_best
from core.search.tree import Node

if TYPE_CHECKING:
    from core.evaluate.ray_executor import RayEvaluator


@dataclass
class CounterReads:
    count: int  # the best kernels of each site to read; 0: none
    store_verdict: Callable[[int, Verdict], None]  # a candidate's latest verdict, kept
    say: Callable[[str], None]  # a progress line

    def queue(self, run: SiteRun) -> None:
        """The site's best few kernels without counters, to be read beside its next round."""
        if self.count:
            run.to_profile = unprofiled_best(run.search, self.count, run.profiled)

    def beside(self, run: SiteRun, items: list[tuple[Path, str]],
               evaluator: Evaluator | RayEvaluator) -> list[Verdict]:
        """The verdicts of a round's `items`, judged together with the site's queued reads,
        which are merged here."""
        queued, run.to_profile = run.to_profile, []
        verdicts = evaluator.evaluate_many(
            [*items, *((run.problem, source_of(node)) for node in queued)],
            counters=[False] * len(items) + [True] * len(queued))
        self.merge(run, queued, verdicts[len(items):])
        return verdicts[:len(items)]

    def flush(self, runs: list[SiteRun], evaluator: Evaluator | RayEvaluator) -> None:
        """The reads still queued when the search ends, made for every site at once."""
        queued = [(run, node) for run in runs for node in run.to_profile]
        verdicts = evaluator.evaluate_many(
            [(run.problem, source_of(node)) for run, node in queued],
            counters=True) if queued else []
        for run in runs:
            mine = [(node, v) for (owner, node), v in zip(queued, verdicts, strict=True)
                    if owner is run]
            self.merge(run, [node for node, _ in mine], [v for _, v in mine])
            run.to_profile = []

    def merge(self, run: SiteRun, nodes: list[Node], judged: list[Verdict]) -> None:
        """The counters read for the site's `nodes` merged into their verdicts, and said."""
        if not nodes:
            return
        verdicts = merge_counters(nodes, judged, run.profiled, run.stored, self.store_verdict)
        read = [v for v in verdicts if v.counters and v.counters["kernels"]]
        if read:
            self.say(f"{run.site.key}: hardware counters read for {len(read)} of its best "
                     "kernels")
        if len(read) < len(verdicts):
            missing = next(v for v in verdicts if v not in read)
            notes = (missing.counters or {}).get("notes") or ["(no note)"]
            self.say(f"{run.site.key}: no hardware counters for {len(verdicts) - len(read)} "
                     f"kernel(s): {notes[0]}")
