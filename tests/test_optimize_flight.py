"""Workers kept busy: a free worker takes the next candidate while another is still judged, a
node whose children are in flight is not expanded again until they land, and a run lands each
verdict as it comes and launches the next expansions with it known, not a round at a time."""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Sequence
from concurrent.futures import Future
from pathlib import Path

import pytest

from core.evaluate.config import EvalConfig
from core.evaluate.pool import WorkerPool
from core.evaluate.verdict import Verdict
from core.optimize.config import OptimizeConfig
from core.optimize.run import OptimizeRun
from core.profile.in_situ import ProfileConfig
from core.profile.pipeline import ListSitesConfig
from core.profile.progress import Progress
from core.search.tree import SiteSearch
from generators.base import Feedback, Proposal, Proposals


def test_a_free_worker_takes_the_next_candidate_while_another_is_judged():
    pool = WorkerPool(EvalConfig(device="cpu"), workers=2)
    release = threading.Event()

    def slow(on_worker) -> Verdict:
        assert release.wait(30), "the slow candidate was never released"
        return Verdict(correct=True, latency_ms=2.0)

    def quick(on_worker) -> Verdict:
        return Verdict(correct=True, latency_ms=1.0)

    try:
        held = pool.submit(slow)
        others = [pool.submit(quick) for _ in range(3)]
        # All three judged on the other worker while the first is still in hand.
        assert [f.result(timeout=30).latency_ms for f in others] == [1.0, 1.0, 1.0]
        assert not held.done()
        release.set()
        assert held.result(timeout=30).latency_ms == 2.0
        assert held.result().eval_seconds >= 0.0
    finally:
        release.set()
        pool.close()


def test_a_closed_pool_starts_nothing_still_queued():
    pool = WorkerPool(EvalConfig(device="cpu"), workers=1)
    started, release = threading.Event(), threading.Event()
    held = pool.submit(lambda on_worker: (started.set(), release.wait(30),
                                          Verdict(correct=True))[2])
    queued = pool.submit(lambda on_worker: pytest.fail("a queued job ran after close"))
    assert started.wait(30)
    closing = threading.Thread(target=pool.close)
    closing.start()
    release.set()
    closing.join(30)
    assert held.result().correct and queued.cancelled()


def drafts(names: Sequence[str]) -> Proposals:
    return Proposals([Proposal(name, "triton", "rules", "") for name in names])


def test_a_node_with_children_in_flight_is_not_expanded_until_they_land():
    asked: list[str | None] = []

    def propose(parent, n):
        asked.append(None if parent is None else parent.proposal.source)
        base = "root" if parent is None else parent.proposal.source
        return drafts([f"{base}.{i}" for i in range(n)])

    search = SiteSearch(1.0, 0.01, propose, None, record=lambda node: None)
    first = search.launch(limit=2)
    assert [p.source for _, p in first] == ["root.0", "root.1"]
    # The root is busy: nothing else can grow, which is waiting, not being stuck.
    assert search.launch(limit=2, busy=frozenset({search.root})) == []
    assert not search.stuck and asked == [None]
    parent, proposal = first[0]
    search.land(parent, proposal, Feedback(correct=True, latency_ms=0.5, baseline_ms=1.0))
    second = search.launch(limit=2, busy=frozenset({search.root}))
    assert [p.source for _, p in second] == ["root.0.0", "root.0.1"]
    with pytest.raises(ValueError, match="no evaluate"):
        search.step()


class HoldingEvaluator:
    """Judges nothing: a verdict for each candidate at once, but for the first, held until
    `hold_for` others came back. `slots` workers, as the run sees them."""

    slots = 2

    def __init__(self, hold_for: int) -> None:
        self.hold_for = hold_for
        self.held: Future[Verdict] | None = None
        self.given = 0
        self.sent: list[str] = []
        self.races: list[float | None] = []

    def __enter__(self) -> HoldingEvaluator:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.held is not None and not self.held.done():
            self.held.set_result(self.verdict())

    def verdict(self) -> Verdict:
        return Verdict(correct=True, latency_ms=1.0 + self.given / 100, baseline_ms=1.0)

    def submit(self, items: Sequence[tuple[Path, str]], counters: object = False,
               race_ms: float | None = None) -> list[Future[Verdict]]:
        futures = []
        for _, source in items:
            self.sent.append(source)
            self.races.append(race_ms)
            future: Future[Verdict] = Future()
            if self.held is None:
                self.held = future
            else:
                self.given += 1
                future.set_result(self.verdict())
                if self.given == self.hold_for:
                    self.held.set_result(self.verdict())
            futures.append(future)
        return futures

    def evaluate_many(self, items, counters=False) -> list[Verdict]:
        return [f.result() for f in self.submit(items, counters)]

    def stop_now(self, futures) -> None:
        raise AssertionError("nothing interrupts this run")


def test_a_run_lands_verdicts_as_they_come_while_a_slow_one_is_judged(tmp_path, monkeypatch):
    evaluator = HoldingEvaluator(hold_for=4)
    monkeypatch.setattr(OptimizeRun, "_evaluator", lambda self, config: evaluator)
    profile = ListSitesConfig(model="tests.models:make_mlp", device="cpu",
                              out=tmp_path / "out", profile=ProfileConfig(0, 2), quiet=True)
    config = OptimizeConfig(profile=profile, db=tmp_path / "kiln.db", max_candidates=8,
                            sites=1, tiers=("triton",), site_compile=False, e2e=False,
                            workers=2, counters=0)
    report = OptimizeRun(config, Progress(enabled=False)).execute()
    assert report["status"] == "done" and report["searched"][0]["evaluations"] == 8
    sources = [row[0] for row in sqlite3.connect(tmp_path / "kiln.db").execute(
        "SELECT source FROM candidates ORDER BY id")]
    # Stored as they landed: the first candidate sent came back with the fourth of the others,
    # after three the run had launched and landed meanwhile (judged a round at a time, the
    # run would have waited for it).
    assert len(evaluator.sent) == 8 and sources.index(evaluator.sent[0]) == 3
    # Each candidate raced its site's best time when it was sent: its eager baseline at first
    # (compile is off), then the baseline the judge measured (1.0 ms here, which no verdict
    # beat).
    (eager,) = sqlite3.connect(tmp_path / "kiln.db").execute("SELECT eager_ms FROM sites"
                                                             ).fetchone()
    assert evaluator.races[0] == pytest.approx(eager)
    assert set(evaluator.races) <= {evaluator.races[0], 1.0} and evaluator.races[-1] == 1.0
