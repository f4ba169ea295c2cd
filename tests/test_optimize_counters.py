"""Hardware counters for each site's best kernels during a search, and the switch that turns
feedback off: which kernels are profiled, what their stored verdict keeps, and a whole CPU run
(where ncu has no GPU to read, so each profiled verdict carries the note instead)."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from core.evaluate.config import EvalConfig
from core.evaluate.evaluator import item_configs
from core.evaluate.verdict import Reason, Verdict
from core.optimize.run import feedback_of
from core.search.best_counters import merge_counters, source_of, unprofiled_best, with_counters
from core.search.tree import SiteSearch
from generators.base import Feedback, Proposal
from tests.test_list_sites_cli import run_cli

COUNTERS = {"kernels": [{"name": "k", "dram_pct": 88.0}], "notes": [], "seconds": 9.0}


def tree(latencies: list[float | None]) -> SiteSearch:
    """A site whose root has one child per latency (None: rejected), candidate ids 1, 2, ..."""
    search = SiteSearch(1.0, 0.01, propose=None, evaluate=None, record=None)
    for number, latency in enumerate(latencies, 1):
        feedback = Feedback(correct=latency is not None, latency_ms=latency, baseline_ms=1.0,
                            diagnosis="latency-bound: at 5% of the byte floor")
        search.adopt(search.root, Proposal(f"source {number}", "triton", "rules", ""), feedback,
                     number)
    return search


def test_the_fastest_accepted_kernels_not_yet_profiled():
    search = tree([0.5, None, 0.2, 0.3, 0.9])
    assert [n.candidate_id for n in unprofiled_best(search, 3, set())] == [3, 4, 1]
    assert [n.candidate_id for n in unprofiled_best(search, 3, {3})] == [4, 1]
    assert unprofiled_best(search, 2, {3, 4}) == []


def test_the_profiled_verdict_keeps_the_first_timing_and_takes_the_counters():
    first = Verdict(correct=True, latency_ms=0.2, diagnosis="latency-bound: old")
    again = Verdict(correct=True, latency_ms=0.21, counters=COUNTERS,
                    diagnosis="excess memory traffic: DRAM 88%")
    merged = with_counters(first, again)
    assert (merged.latency_ms, merged.counters, merged.diagnosis) == (
        0.2, COUNTERS, "excess memory traffic: DRAM 88%")
    failed = with_counters(first, Verdict.rejected(Reason.TIMEOUT, "no verdict in 120s"))
    assert failed.diagnosis == "latency-bound: old" and failed.latency_ms == 0.2
    assert failed.counters["kernels"] == []
    assert failed.counters["notes"][0].startswith("no counters: judged again to read them, it "
                                                  "was rejected (timeout)")


def test_profiling_stores_each_best_once_and_steers_its_children():
    search = tree([0.5, 0.2, 0.3])
    first = {i: Verdict(correct=True, latency_ms=search_latency)
             for i, search_latency in ((1, 0.5), (2, 0.2), (3, 0.3))}
    stored: dict[int, Verdict] = {}
    profiled: set[int] = set()
    nodes = unprofiled_best(search, 2, profiled)
    assert [source_of(n) for n in nodes] == ["source 2", "source 3"]
    judged = [Verdict(correct=True, latency_ms=9.9, counters=COUNTERS,
                      diagnosis=f"excess memory traffic: kernel {n.candidate_id}") for n in nodes]
    verdicts = merge_counters(nodes, judged, profiled, first, stored.__setitem__)
    assert sorted(stored) == [2, 3] and profiled == {2, 3}
    assert [v.latency_ms for v in verdicts] == [0.2, 0.3]
    node = next(n for n in search.nodes() if n.candidate_id == 2)
    assert node.feedback.diagnosis == "excess memory traffic: kernel 2"
    assert node.feedback.latency_ms == 0.2
    assert unprofiled_best(search, 2, profiled) == [], "a kernel would be profiled twice"
    with pytest.raises(ValueError, match="no kernel to judge"):
        source_of(search.root)


def test_each_item_is_judged_with_counters_or_without_as_flagged():
    config = EvalConfig(device="cpu")
    plain, profiled, also_plain = item_configs(config, 3, [False, True, False])
    assert plain == also_plain == config and profiled == config.with_counters()
    assert profiled != config
    assert item_configs(config, 2, True) == [config.with_counters()] * 2
    assert item_configs(config, 2, False) == [config] * 2
    with pytest.raises(ValueError, match="1 counters flags for 2 items"):
        item_configs(config, 2, [True])


def test_without_feedback_the_generator_sees_no_diagnosis():
    verdict = Verdict(correct=True, latency_ms=0.2, diagnosis="spilling: 64 bytes")
    assert feedback_of(verdict, 0.1).diagnosis == "spilling: 64 bytes"
    assert feedback_of(verdict, 0.1, diagnosis=False).diagnosis == ""
    assert feedback_of(verdict, 0.1, diagnosis=False).latency_ms == 0.2


def counted_cpu_run(tmp_path, candidates: int, workers: int) -> tuple[Path, str]:
    """A CPU run of the small MLP's first site reading counters for its best kernel: the store
    and what the run printed on stderr."""
    db = tmp_path / "kiln.db"
    result = run_cli("tests.models:make_mlp", "--device", "cpu", "--json", "--db", str(db),
                     "--max-candidates", str(candidates), "--sites", "1", "--workers",
                     str(workers), "--trials", "2", "--warmup", "0", "--counters", "1",
                     "--no-e2e", "--out", str(tmp_path / "out"))
    assert result.returncode == 0, result.stderr
    return db, result.stderr


def test_a_cpu_run_profiles_its_best_kernel_and_notes_why_there_are_no_counters(tmp_path):
    db, stderr = counted_cpu_run(tmp_path, candidates=4, workers=1)
    assert "no hardware counters for 1 kernel(s): hardware counters need a CUDA device" \
        in stderr
    rows = sqlite3.connect(db).execute(
        "SELECT candidate_id, id, verdict FROM verdicts ORDER BY id").fetchall()
    by_candidate: dict[int, list[dict]] = {}
    for candidate, _, verdict in rows:
        by_candidate.setdefault(candidate, []).append(json.loads(verdict))
    twice = {c: v for c, v in by_candidate.items() if len(v) > 1}
    assert twice, "no kernel was judged again for its counters"
    correct = [v[0] for v in by_candidate.values() if v[0]["correct"]]
    best = min(correct, key=lambda v: v["latency_ms"])
    for first, latest in twice.values():
        assert first["counters"] is None and latest["latency_ms"] == first["latency_ms"]
        assert latest["counters"]["notes"] == [
            "hardware counters need a CUDA device; this run is on cpu"]
    assert any(v[0]["latency_ms"] == best["latency_ms"] for v in twice.values())
    config = json.loads(sqlite3.connect(db).execute("SELECT config FROM runs").fetchone()[0])
    assert (config["counters"], config["feedback"]) == (1, True)


def test_a_negative_counter_count_is_refused(tmp_path):
    result = run_cli("tests.models:make_mlp", "--device", "cpu", "--counters", "-1",
                     "--db", str(tmp_path / "kiln.db"))
    assert result.returncode == 2
    assert "--counters -1 is negative" in result.stderr
    assert not (tmp_path / "kiln.db").exists()


def test_counters_are_read_beside_the_next_round_and_the_last_best_at_the_end(tmp_path):
    db, _ = counted_cpu_run(tmp_path, candidates=12, workers=2)
    rows = [(ident, candidate, json.loads(verdict)) for ident, candidate, verdict in
            sqlite3.connect(db).execute("SELECT id, candidate_id, verdict FROM verdicts "
                                        "ORDER BY id")]
    again = {candidate: ident for ident, candidate, verdict in rows if verdict["counters"]}
    first = {candidate: (ident, verdict) for ident, candidate, verdict in reversed(rows)
             if not verdict["counters"]}
    assert all(first[candidate][0] < ident for candidate, ident in again.items()), rows
    # A read stored before the verdicts of candidates judged in the same round as it.
    assert any(ident < first_ident for ident in again.values()
               for first_ident, _ in first.values()), rows
    # And when the search ends, the fastest kernel has been read, whenever it came.
    timed = {c: v["latency_ms"] for c, (_, v) in first.items() if v["correct"]}
    assert min(timed, key=timed.__getitem__) in again, rows
