"""Records: what the writer stores comes back the same; duplicates, bad values, transactions."""

from __future__ import annotations

import json

import pytest
from store_fixture import fill_store, triton_candidate, verdict

from store import Store, source_hash


def test_run_site_candidate_and_verdict_come_back_as_written(tmp_path):
    filled = fill_store(tmp_path / "kiln.db")
    with Store.open(filled.path) as store:
        run = store.run(filled.run)
        assert (run.model_spec, run.model_hash, run.gpu) == (
            "examples/block.py",
            "9f2c41aa",
            "NVIDIA H200",
        )
        assert run.versions["triton"] == "3.6.0" and run.config["budget"] == 64
        assert (run.status, run.sites, run.candidates, run.accepted) == ("running", 2, 5, 2)

        site = store.site(filled.pointwise)
        assert site.ops == ["aten.add.Tensor", "aten.relu.default", "aten.mul.Tensor"]
        assert (site.calls, site.share, site.floor_ms, site.baseline_ms) == (12, 0.4, 0.3, 0.9)
        assert [s.id for s in store.sites(filled.run)] == [filled.pointwise, filled.reduction]

        faster = store.candidate(filled.faster)
        assert faster.source == triton_candidate(256)
        assert faster.source_hash == source_hash(triton_candidate(256))
        assert faster.summary.parent_id == filled.draft
        assert faster.verdict == verdict(accepted=True, latency_ms=0.5).to_dict()
        summary = faster.summary
        assert (summary.accepted, summary.latency_ms, summary.speedup) == (True, 0.5, 2.0)
        # The site's eager 1.0 ms, compile 0.9 ms and floor 0.3 ms against the kernel's 0.5 ms.
        assert summary.speedup_vs_eager == pytest.approx(2.0)
        assert summary.speedup_vs_compile == pytest.approx(1.8)
        assert summary.roofline_fraction == pytest.approx(0.6)

        pending = store.candidate(filled.pending)
        assert pending.verdict is None and pending.summary.accepted is None


def test_indexed_verdict_columns_hold_statistics_library_ops_and_flags(tmp_path):
    filled = fill_store(tmp_path / "kiln.db")
    with Store.open(filled.path) as store:
        judged = verdict(accepted=True, latency_ms=0.4)
        judged.library_ops = ["aten.mm"]
        judged.flagged = True
        judged.tolerance_name = "tf32"
        store.add_verdict(filled.pending, judged)
        row = store.db.execute(
            "SELECT latency_ms, latency_mean_ms, latency_min_ms, latency_max_ms,"
            " latency_stdev_ms, timing_trials, timing_device, library_ops, flagged,"
            " tolerance_name, reason_code, crashed, timed_out FROM verdicts"
            " WHERE candidate_id = ?",
            [filled.pending],
        ).fetchone()
        expected = (0.4, 0.408, 0.388, 0.48, 0.012, 50, "NVIDIA H200", '["aten.mm"]', 1, "tf32")
        assert row == pytest.approx((*expected, "", 0, 0))


def test_a_verdict_field_added_later_is_kept_without_a_migration(tmp_path):
    filled = fill_store(tmp_path / "kiln.db")
    with Store.open(filled.path) as store:
        later = verdict(accepted=True, latency_ms=0.3).to_dict() | {"ncu_dram_util": 0.83}
        store.add_verdict(filled.pending, later)
        stored = store.candidate(filled.pending)
        assert stored.verdict["ncu_dram_util"] == 0.83
        assert stored.summary.latency_ms == 0.3


def test_a_new_verdict_becomes_the_latest_and_the_old_one_is_kept(tmp_path):
    filled = fill_store(tmp_path / "kiln.db")
    with Store.open(filled.path) as store:
        store.add_verdict(
            filled.draft, verdict(accepted=False, latency_ms=0.8, reason="not reproduced")
        )
        assert store.candidate(filled.draft).summary.reason == "not reproduced"
        count = store.db.execute(
            "SELECT count(*) FROM verdicts WHERE candidate_id = ?", [filled.draft]
        ).fetchone()[0]
        assert count == 2


def test_same_source_in_a_site_is_a_duplicate_even_with_whitespace_changes(tmp_path):
    filled = fill_store(tmp_path / "kiln.db")
    with Store.open(filled.path) as store:
        respaced = triton_candidate(256).replace("\n", "   \n") + "\n\n"
        again = store.add_candidate(
            filled.pointwise, parent_id=filled.draft, tier="triton", generator="llm",
            rationale="same kernel again", source=respaced,
        )  # fmt: skip
        assert (again.id, again.duplicate) == (filled.faster, True)
        elsewhere = store.add_candidate(
            filled.reduction, parent_id=None, tier="triton", generator="rules",
            rationale="same text, other site", source=respaced,
        )  # fmt: skip
        assert not elsewhere.duplicate
        assert store.run(filled.run).candidates == 6


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"tier": "cutlass"}, "tier must be one of triton, cuda"),
        ({"parent_id": 10_000}, "parent candidate 10000 does not exist"),
        ({"site_id": 10_000}, "there is no site 10000"),
    ],
)
def test_bad_candidate_values_are_refused(tmp_path, change, message):
    filled = fill_store(tmp_path / "kiln.db")
    fields = {
        "site_id": filled.pointwise, "parent_id": None, "tier": "triton", "generator": "rules",
        "rationale": "r", "source": "new source",
    } | change  # fmt: skip
    with Store.open(filled.path) as store:
        with pytest.raises(ValueError, match=message):
            store.add_candidate(fields.pop("site_id"), **fields)
        assert store.run(filled.run).candidates == 5


def test_a_parent_from_another_site_is_refused(tmp_path):
    filled = fill_store(tmp_path / "kiln.db")
    with Store.open(filled.path) as store, pytest.raises(ValueError, match="is of site"):
        store.add_candidate(
            filled.reduction, parent_id=filled.draft, tier="cuda", generator="rules",
            rationale="r", source="s",
        )  # fmt: skip


def test_bad_site_values_are_refused(tmp_path):
    filled = fill_store(tmp_path / "kiln.db")
    site = {
        "key": "k", "family": "pointwise", "signature": "s", "ops": [], "calls": 1,
        "share": 0.5, "time_ms": 1.0, "eager_ms": 1.0, "compile_ms": 1.0, "floor_ms": 0.1,
        "problem_source": "p",
    }  # fmt: skip
    with Store.open(filled.path) as store:
        with pytest.raises(ValueError, match="family must be one of pointwise, reduction"):
            store.add_site(filled.run, **(site | {"family": "scan"}))
        with pytest.raises(ValueError, match="share is a fraction"):
            store.add_site(filled.run, **(site | {"share": 1.5}))


def test_a_verdict_without_its_flags_is_refused_and_stores_nothing(tmp_path):
    filled = fill_store(tmp_path / "kiln.db")
    with Store.open(filled.path) as store:
        with pytest.raises(ValueError, match="lacks accepted"):
            store.add_verdict(filled.pending, {"compiled": True, "correct": True})
        assert store.candidate(filled.pending).verdict is None


def test_a_failed_batch_leaves_nothing_behind(tmp_path):
    filled = fill_store(tmp_path / "kiln.db")
    with Store.open(filled.path) as store:
        with pytest.raises(RuntimeError, match="evaluator died"), store.batch():
            new = store.add_candidate(
                filled.pointwise, parent_id=None, tier="cuda", generator="rules",
                rationale="r", source="s",
            )  # fmt: skip
            raise RuntimeError("evaluator died")
        assert new.id not in [c.id for c in store.candidates()]
        assert store.search("evaluator") == []


def test_finished_run_keeps_its_results_and_takes_no_more_writes(tmp_path):
    filled = fill_store(tmp_path / "kiln.db")
    with Store.open(filled.path) as store:
        store.finish_run(filled.run, e2e={"speedup_vs_eager": 1.31, "speedup_vs_compile": 1.05})
        run = store.run(filled.run)
        assert run.status == "done" and run.finished_at is not None
        assert run.e2e == {"speedup_vs_eager": 1.31, "speedup_vs_compile": 1.05}
        with pytest.raises(ValueError, match=f"cannot write to run {filled.run}: it is done"):
            store.add_verdict(filled.pending, verdict(accepted=True, latency_ms=0.1))


def test_llm_calls_are_listed_with_tokens_and_cost(tmp_path):
    filled = fill_store(tmp_path / "kiln.db")
    with Store.open(filled.path) as store:
        (call,) = store.llm_calls(filled.run)
        assert (call.id, call.model, call.site_id) == (filled.llm_call, "gpt-4.1", filled.reduction)
        assert (call.prompt_tokens, call.completion_tokens, call.cost_usd) == (812, 344, 0.0043)
        assert store.candidate(filled.broken).llm_call_id == filled.llm_call
        assert json.loads(json.dumps(call.to_dict()))["latency_ms"] == 2150.0
