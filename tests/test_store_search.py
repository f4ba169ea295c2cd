"""Full-text search over source, rationale, site signature and ops, and rejection reasons."""

from __future__ import annotations

import json

import pytest
from store_fixture import (
    assert_search_index_matches_records,
    fill_store,
    run_cli,
    triton_candidate,
    verdict,
)

from core.runtime.errors import KilnInputError
from store import Store, open_reader


def found(store, query: str, **options) -> set[int]:
    return {hit.id for hit in store.search(query, **options)}


def test_each_indexed_field_is_searchable(tmp_path):
    filled = fill_store(tmp_path / "kiln.db")
    pointwise = {filled.draft, filled.faster, filled.mismatch, filled.pending}
    with open_reader(filled.path) as store:
        assert found(store, "tl.maximum") == pointwise, "source"
        assert found(store, "whole row in registers") == {filled.broken}, "rationale"
        assert found(store, "f32[16,1000]") == {filled.broken}, "site signature"
        assert found(store, "aten.relu.default") == pointwise, "site ops"
        assert found(store, "tolerance") == {filled.mismatch}, "rejection reason"
        assert found(store, "wrong_values") == {filled.mismatch}, "rejection reason code"
        assert found(store, "cutlass") == set()


def test_plain_text_with_search_operators_is_taken_literally(tmp_path):
    filled = fill_store(tmp_path / "kiln.db")
    with open_reader(filled.path) as store:
        for text in ["tl.load(x_ptr + offsets", "relu AND", '"summ', "NOT", "mask=mask)", "*"]:
            store.search(text)
        assert found(store, "no attribute 'summ'") == {filled.broken}


def test_fts_syntax_when_asked_for(tmp_path):
    filled = fill_store(tmp_path / "kiln.db")
    with open_reader(filled.path) as store:
        assert found(store, "registers OR tolerance", fts_syntax=True) == {
            filled.broken,
            filled.mismatch,
        }
        assert found(store, "reason:compile*", fts_syntax=True) == {filled.broken}
        assert found(store, "rationale:blocks NOT rationale:128", fts_syntax=True) == {
            filled.faster
        }
        assert found(store, '"fuse add"', fts_syntax=True) == {filled.draft}


@pytest.mark.parametrize("query", ["relu AND", '"unterminated', "nosuchcolumn:x", "(mask", "*"])
def test_invalid_fts_syntax_is_a_clear_input_error(tmp_path, query):
    filled = fill_store(tmp_path / "kiln.db")
    with open_reader(filled.path) as store, pytest.raises(KilnInputError) as caught:
        store.search(query, fts_syntax=True)
    assert "not valid full-text search syntax" in caught.value.problem
    assert "--fts" in caught.value.fix


def test_best_matches_come_first_with_a_snippet(tmp_path):
    filled = fill_store(tmp_path / "kiln.db")
    with open_reader(filled.path) as store:
        hits = store.search("blocks OR programs", fts_syntax=True)
        assert [hit.id for hit in hits] == [filled.faster, filled.pending]
        assert hits[0].snippet == "smaller [blocks] for more [programs] in flight"
        assert len(store.search("tl", limit=2)) == 2


def test_a_query_matching_too_many_to_rank_lists_the_newest_first(tmp_path, monkeypatch):
    filled = fill_store(tmp_path / "kiln.db")
    with open_reader(filled.path) as store:
        ranked = [hit.id for hit in store.search("tl.maximum")]
        monkeypatch.setattr("store.reader.RANKED_MATCHES_MAX", 3)
        newest_first = [hit.id for hit in store.search("tl.maximum")]
    assert newest_first == [filled.pending, filled.mismatch, filled.faster, filled.draft]
    assert sorted(ranked) == sorted(newest_first)


def test_search_within_one_run(tmp_path):
    filled = fill_store(tmp_path / "kiln.db")
    with Store.open(filled.path) as store:
        run = store.start_run(
            model_spec="other.py", model_hash="1", gpu="H200", versions={}, config={}
        )
        site = store.add_site(
            run, key="pointwise-99999999", family="pointwise", signature="relu(f32[8])",
            ops=["aten.relu.default"], calls=1, share=1.0, time_ms=None, eager_ms=None,
            compile_ms=None, floor_ms=None, problem_source="problem",
        )  # fmt: skip
        second = store.add_candidate(
            site, parent_id=None, tier="triton", generator="rules", rationale="r",
            source=triton_candidate(64),
        ).id  # fmt: skip
        assert found(store, "tl.maximum", run_id=run) == {second}
        assert second not in found(store, "tl.maximum", run_id=filled.run)


def test_the_index_follows_a_replaced_verdict(tmp_path):
    filled = fill_store(tmp_path / "kiln.db")
    with Store.open(filled.path) as store:
        store.add_verdict(filled.mismatch, verdict(accepted=True, latency_ms=0.45))
        store.add_verdict(filled.pending, verdict(accepted=False, latency_ms=2.0, reason="slower"))
        assert found(store, "tolerance") == set()
        assert found(store, "slower") == {filled.pending}
    assert_search_index_matches_records(filled.path)


def test_cli_search_lists_candidates_as_json(tmp_path):
    filled = fill_store(tmp_path / "kiln.db")
    result = run_cli("search", "compile", "--db", str(filled.path), "--json")
    assert result.returncode == 0, result.stderr
    (hit,) = json.loads(result.stdout)
    assert hit["id"] == filled.broken
    assert (hit["site_id"], hit["family"], hit["tier"]) == (filled.reduction, "reduction", "triton")
    assert (hit["generator"], hit["accepted"], hit["latency_ms"]) == ("llm", False, None)
    assert {"parent_id", "speedup", "snippet"} <= hit.keys()

    table = run_cli("--db", str(filled.path), "search", "reason:compile*", "--fts")
    assert table.returncode == 0, table.stderr
    assert table.stdout.splitlines()[0].split()[:3] == ["id", "parent_id", "site_id"]
    assert table.stdout.splitlines()[1].split()[0] == str(filled.broken)
