"""Hardware counters of each site's best kernels, read while the search goes on.

A site's best few kernels without counters are due a read (`CounterReads.due`); the run judges
them again with Nsight Compute beside the candidates it has in flight (`core.optimize.flight`:
a read holds one worker for seconds, which between rounds would leave the others idle), and
`merge` gives each its counters and the diagnosis they draw. Reads still due when the search
ends are made for every site at once (`flush`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
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

    def due(self, run: SiteRun, reading: list[Node]) -> list[Node]:
        """The site's best few kernels without counters, but for those being read."""
        if not self.count:
            return []
        return [n for n in unprofiled_best(run.search, self.count, run.profiled)
                if n not in reading]

    def flush(self, runs: list[SiteRun], evaluator: Evaluator | RayEvaluator) -> None:
        """The reads still due when the search ends, made for every site at once."""
        queued = [(run, node) for run in runs for node in self.due(run, [])]
        verdicts = evaluator.evaluate_many(
            [(run.problem, source_of(node)) for run, node in queued],
            counters=True) if queued else []
        for run in runs:
            mine = [(node, v) for (owner, node), v in zip(queued, verdicts, strict=True)
                    if owner is run]
            self.merge(run, [node for node, _ in mine], [v for _, v in mine])

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
