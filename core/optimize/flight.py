"""What a run has being judged at this moment: candidates of the sites' searches and counter
reads of their best kernels, each a future of the evaluator's.

The run keeps about one more item in flight than the evaluator has workers, so that a worker
that finishes takes the next item at once, while the run lands the verdict that came back and
launches the next expansion with it known (`core.optimize.run.OptimizeRun._search`). Judged in
rounds instead, every round ended with workers idle until its slowest candidate came back.
"""

from __future__ import annotations

import time
from concurrent.futures import FIRST_COMPLETED, Future, wait
from dataclasses import dataclass
from typing import TYPE_CHECKING

from core.evaluate import Evaluator, Verdict
from core.optimize.site_run import SiteRun
from core.search.best_counters import source_of
from core.search.tree import Node
from generators.base import Proposal

if TYPE_CHECKING:
    from core.evaluate.ray_executor import RayEvaluator

# The most of the workers' time counter reads may take (a read holds a worker for seconds, some
# 8.6 s at 95_CrossEntropyLoss, bench/NOTES.md, 2026-12-07, 10:03-): what they took when read
# between rounds, so that the diagnosis they give costs no more candidates than it did then.
READ_SHARE = 0.2


@dataclass(eq=False)
class Launch:
    """One batch of a site's expansions; the site has taken a step once all of it landed."""

    run: SiteRun
    left: int


@dataclass(eq=False)
class Pending:
    run: SiteRun
    node: Node  # the parent a candidate hangs under, or the kernel a read is for
    proposal: Proposal | None  # None: a counters read of `node`
    launch: Launch | None = None


class Flight:
    def __init__(self, evaluator: Evaluator | RayEvaluator) -> None:
        self.evaluator = evaluator
        self.pending: dict[Future[Verdict], Pending] = {}
        self.started = time.monotonic()
        self.read_seconds = 0.0  # of workers' time, in counter reads that landed

    def may_read(self) -> bool:
        """A counters read may start: none is in flight, and reads have taken at most
        READ_SHARE of the workers' time so far."""
        elapsed = self.evaluator.slots * (time.monotonic() - self.started)
        return not self.reads() and self.read_seconds <= READ_SHARE * elapsed

    def __len__(self) -> int:
        return len(self.pending)

    @property
    def capacity(self) -> int:
        """Items worth having in flight: every worker busy, and one waiting for the first
        worker to be free."""
        return self.evaluator.slots + 1

    @property
    def candidates(self) -> int:
        return sum(1 for p in self.pending.values() if p.proposal is not None)

    @property
    def room(self) -> int:
        return self.capacity - len(self.pending)

    def busy(self, run: SiteRun) -> frozenset[Node]:
        """The site's nodes whose children are being judged."""
        return frozenset(p.node for p in self.pending.values()
                         if p.run is run and p.proposal is not None)

    def reads(self, run: SiteRun | None = None) -> list[Node]:
        """Kernels whose counters are being read, of `run` or of every site."""
        return [p.node for p in self.pending.values()
                if p.proposal is None and (run is None or p.run is run)]

    def launch(self, run: SiteRun, expansions: list[tuple[Node, Proposal]]) -> None:
        batch = Launch(run, len(expansions))
        futures = self.evaluator.submit([(run.problem, p.source) for _, p in expansions],
                                        race_ms=run.search.race_ms)
        for future, (parent, proposal) in zip(futures, expansions, strict=True):
            self.pending[future] = Pending(run, parent, proposal, batch)

    def read(self, run: SiteRun, node: Node) -> None:
        (future,) = self.evaluator.submit([(run.problem, source_of(node))], counters=True)
        self.pending[future] = Pending(run, node, None)

    def landed(self) -> list[tuple[Pending, Verdict]]:
        """What came back, once something has: in the order it was sent."""
        wait(list(self.pending), return_when=FIRST_COMPLETED)
        landed = [(self.pending.pop(f), f.result()) for f in list(self.pending) if f.done()]
        self.read_seconds += sum(v.eval_seconds or 0.0 for p, v in landed if p.proposal is None)
        return landed

    def cancel_queued(self) -> None:
        """The budget is spent: what no worker has started is dropped, the rest lands."""
        for future in [f for f in self.pending if f.cancel()]:
            del self.pending[future]

    def stop(self) -> None:
        """Ctrl-C: nothing queued starts, and the workers judging are ended."""
        self.evaluator.stop_now(list(self.pending))
        self.pending.clear()
