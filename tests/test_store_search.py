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
from store import VERDICTS, SearchFilters, Store, open_reader
from store.search import plain_words


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


def add_warps_kernel(filled) -> int:
    """A second softmax of the reduction site, whose rationale speaks of warps."""
    with Store.open(filled.path) as store:
        return store.add_candidate(
            filled.reduction, parent_id=None, tier="triton", generator="rules",
            rationale="two warps per row, max and sum in one pass",
            source=triton_candidate(32),
        ).id  # fmt: skip


def test_plain_words_match_the_start_of_words(tmp_path):
    filled = fill_store(tmp_path / "kiln.db")
    warps = add_warps_kernel(filled)
    with open_reader(filled.path) as store:
        assert found(store, "softmax warp") == {warps}
        assert found(store, "softmax warps") == {warps}
        assert found(store, "smal BLOCK") == {filled.faster}
        assert found(store, "warp", fts_syntax=True) == set(), "FTS syntax: whole words"
    result = run_cli("--db", str(filled.path), "search", "softmax warp", "--json")
    assert [hit["id"] for hit in json.loads(result.stdout)] == [warps], result.stderr


def test_plain_words_are_quoted_so_no_text_is_fts_syntax():
    assert plain_words('say "hi" NEAR(a b)  rationale:x *') == (
        '"say"* """hi"""* "NEAR(a"* "b)"* "rationale:x"* "*"*'
    )


def test_plain_text_with_a_column_filter_is_taken_literally(tmp_path):
    filled = fill_store(tmp_path / "kiln.db")
    with open_reader(filled.path) as store:
        assert found(store, "rationale:blocks", fts_syntax=True) == {filled.faster, filled.pending}
        assert found(store, "rationale:blocks") == set()


def searched(store, query: str = "", **filters) -> list[int]:
    return [hit.id for hit in store.search(query, filters=SearchFilters(**filters))]


def test_filters_narrow_a_search_and_a_blank_query_lists_the_newest(tmp_path):
    filled = fill_store(tmp_path / "kiln.db")
    with Store.open(filled.path) as store:
        other = store.start_run(
            model_spec="other.py", model_hash="1", gpu="NVIDIA H100", versions={}, config={}
        )
        site = store.add_site(
            other, key="pointwise-1a2b3c4d", family="pointwise", signature="relu(f32[8])",
            ops=["aten.relu.default"], calls=1, share=1.0, time_ms=None, eager_ms=None,
            compile_ms=None, floor_ms=None, problem_source="problem",
        )  # fmt: skip
        on_h100 = store.add_candidate(
            site, parent_id=None, tier="cuda", generator="llm", rationale="fuse in one pass",
            source=triton_candidate(64),
        ).id  # fmt: skip
    everything = [on_h100, filled.broken, filled.pending, filled.mismatch, filled.faster,
                  filled.draft]  # fmt: skip
    with open_reader(filled.path) as store:
        assert searched(store) == everything
        assert searched(store, verdicts=("accepted",)) == [filled.faster, filled.draft]
        assert searched(store, verdicts=("incorrect", "pending")) == [
            on_h100, filled.pending, filled.mismatch
        ]  # fmt: skip
        assert searched(store, verdicts=("compile failed",)) == [filled.broken]
        assert searched(store, verdicts=("rejected",)) == []
        assert searched(store, generators=("llm",), families=("reduction",)) == [filled.broken]
        assert searched(store, tiers=("cuda",)) == [on_h100]
        assert searched(store, gpus=("NVIDIA H100",)) == [on_h100]
        assert searched(store, runs=(filled.run,)) == everything[1:]
        assert searched(store, "tl.maximum", gpus=("NVIDIA H200",)) == searched(
            store, "tl.maximum", runs=(filled.run,)
        )
        assert set(searched(store, "tl.maximum", runs=(other,))) == {on_h100}
        assert set(searched(store, "one pass", runs=(other, filled.run))) == {on_h100, filled.draft}
        assert searched(store, "one pass", runs=(other,)) == [on_h100]
        assert searched(store, "fuse", tiers=("triton",)) == [filled.draft]
        hits = store.search("blocks OR programs", fts_syntax=True, filters=SearchFilters(
            verdicts=("accepted", "pending")))  # fmt: skip
        assert [hit.id for hit in hits] == [filled.faster, filled.pending], "best match first"
        assert hits[0].snippet == "smaller [blocks] for more [programs] in flight"
        assert store.search("", filters=SearchFilters(tiers=("cuda",)))[0].snippet is None
        assert found(store, "tl.maximum", run_id=other, filters=SearchFilters(runs=(7,))) == {
            on_h100
        }, "run_id stands in place of the filters' runs"
    with pytest.raises(KilnInputError, match="unknown verdict filter 'slow'"):
        SearchFilters(verdicts=("slow",))


def test_filtered_search_too_many_to_rank_lists_the_newest_first(tmp_path, monkeypatch):
    filled = fill_store(tmp_path / "kiln.db")
    with open_reader(filled.path) as store:
        monkeypatch.setattr("store.reader.RANKED_MATCHES_MAX", 3)
        newest_first = searched(store, "tl.maximum", tiers=("triton",))
    assert newest_first == [filled.pending, filled.mismatch, filled.faster, filled.draft]


def test_filter_choices_are_the_values_in_the_store(tmp_path):
    filled = fill_store(tmp_path / "kiln.db")
    with Store.open(filled.path) as store:
        newer = store.start_run(
            model_spec="b.py", model_hash="2", gpu="NVIDIA B200", versions={}, config={}
        )
    with open_reader(filled.path) as store:
        assert store.filter_choices() == SearchFilters(
            tiers=("triton",),
            generators=("llm", "rules"),
            verdicts=VERDICTS,
            families=("pointwise", "reduction"),
            gpus=("NVIDIA B200", "NVIDIA H200"),
            runs=(newer, filled.run),
        )
