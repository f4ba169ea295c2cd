"""Diffs: a candidate against its parent (or the reference), its site's best, any other."""

from __future__ import annotations

import json
import subprocess

from store_fixture import POINTWISE_PROBLEM, fill_store, run_cli, triton_candidate

from store import diff_candidates, diff_to_best, diff_to_parent, open_reader, unified_diff


def apply_patch(tmp_path, old: str, diff: str) -> str:
    """What `patch` makes of OLD with DIFF: the diff is only right if this gives the new text."""
    target = tmp_path / "patched.py"
    target.write_text(old)
    result = subprocess.run(
        ["patch", "--quiet", str(target)], input=diff, capture_output=True, text=True
    )
    assert result.returncode == 0, f"patch refused the diff:\n{result.stdout}{result.stderr}"
    return target.read_text()


def test_diff_against_the_parent_turns_the_parent_into_the_child(tmp_path):
    filled = fill_store(tmp_path / "kiln.db")
    with open_reader(filled.path) as store:
        diff = diff_to_parent(store, filled.faster)
    assert (diff.base_id, diff.candidate_id) == (filled.draft, filled.faster)
    assert diff.text.splitlines()[:2] == [
        f"--- candidate {filled.draft}",
        f"+++ candidate {filled.faster}",
    ]
    assert "-BLOCK_SIZE = 1024\n+BLOCK_SIZE = 256\n" in diff.text
    assert apply_patch(tmp_path, triton_candidate(1024), diff.text) == triton_candidate(256)


def test_a_first_draft_is_diffed_against_the_site_reference(tmp_path):
    filled = fill_store(tmp_path / "kiln.db")
    with open_reader(filled.path) as store:
        diff = diff_to_parent(store, filled.draft)
    assert diff.base_id is None
    assert diff.base_label == "site pointwise-1a2b3c4d reference"
    assert "-        return torch.relu(x + y) * 0.5\n" in diff.text
    assert apply_patch(tmp_path, POINTWISE_PROBLEM, diff.text) == triton_candidate(1024)


def test_diff_against_the_site_best(tmp_path):
    filled = fill_store(tmp_path / "kiln.db")
    with open_reader(filled.path) as store:
        against_best = diff_to_best(store, filled.mismatch)
        assert against_best.base_id == filled.faster
        mismatch_source = store.candidate(filled.mismatch).source
        assert apply_patch(tmp_path, triton_candidate(256), against_best.text) == mismatch_source
        assert diff_to_best(store, filled.faster).text == "", "the best against itself"
        assert diff_to_best(store, filled.broken) is None, "the reduction site has no best"


def test_a_source_without_a_final_newline_still_gives_well_formed_lines():
    text = unified_diff("a\nb", "a\nc", "old", "new")
    assert text.splitlines(keepends=True)[-2:] == ["-b\n", "+c\n"]


def test_cli_diff_gives_parent_and_best_or_the_pair_asked_for(tmp_path):
    filled = fill_store(tmp_path / "kiln.db")
    both = run_cli("--db", str(filled.path), "diff", str(filled.mismatch), "--json")
    assert both.returncode == 0, both.stderr
    assert [(d["base_id"], d["candidate_id"]) for d in json.loads(both.stdout)] == [
        (filled.draft, filled.mismatch),
        (filled.faster, filled.mismatch),
    ]
    pair = run_cli("--db", str(filled.path), "diff", str(filled.draft), str(filled.pending))
    assert pair.returncode == 0, pair.stderr
    with open_reader(filled.path) as store:
        expected = diff_candidates(store, filled.draft, filled.pending).text
    assert pair.stdout == f"# candidate {filled.draft} -> candidate {filled.pending}\n{expected}\n"
