"""One rule names a verdict: "accepted" is correct and faster, "correct, slower" is said plainly,
in the reader, the search filters, the counts, `best` and the CLI's listings."""

from __future__ import annotations

import json

import pytest
from store_fixture import fill_verdict_kinds, run_cli

from store import CPU_TIMINGS, VERDICTS, SearchFilters, cpu_timings, open_reader, verdict_label


@pytest.fixture
def kinds(tmp_path):
    return fill_verdict_kinds(tmp_path / "kiln.db")


def test_each_verdict_reads_as_its_label(kinds):
    with open_reader(kinds.path) as reader:
        read = {c.id: c.verdict_label for c in reader.candidates()}
    assert read == kinds.labels
    assert set(read.values()) == set(VERDICTS), "the store lacks a kind of verdict"


def test_the_label_rule_by_itself():
    assert verdict_label(True, True, True, "", 1.5) == "accepted"
    assert verdict_label(True, True, True, "", None) == "accepted"
    assert verdict_label(True, True, False, "slower", 0.83) == "correct, slower"
    assert verdict_label(True, True, True, "", 1.0) == "correct, slower"
    assert verdict_label(True, True, False, "wrong_after_timing", 1.4) == "rejected"
    assert verdict_label(True, False, False, "wrong_values", None) == "incorrect"
    assert verdict_label(False, False, False, "compile_error", None) == "compile failed"
    assert verdict_label(None, None, None, None, None) == "pending"


def test_each_filter_finds_the_candidates_of_its_label(kinds):
    with open_reader(kinds.path) as reader:
        for label in VERDICTS:
            found = {c.id for c in reader.search("", filters=SearchFilters(verdicts=(label,)))}
            assert found == {i for i, named in kinds.labels.items() if named == label}, label


def test_counts_and_best_take_accepted_as_faster(kinds):
    with open_reader(kinds.path) as reader:
        assert reader.run(kinds.gpu_run).accepted == 1
        # The legacy kernel is the fastest in ms, but slower than its reference.
        assert [c.id for c in reader.best(kinds.gpu_run)] == [kinds.accepted]
        assert [c.id for c in reader.best(kinds.gpu_run, slower=True)] == [kinds.legacy_slower]
        site = reader.candidate(kinds.accepted).summary.site_id
        assert reader.best_of_site(site).id == kinds.accepted


def test_cli_listings_and_show_name_the_verdict(kinds):
    db = ["--db", str(kinds.path)]
    table = run_cli(*db, "candidates", "--run", str(kinds.gpu_run)).stdout.splitlines()
    assert table[0].split()[:7] == ["id", "parent_id", "site_id", "family", "tier", "generator",
                                    "verdict"]
    rows = {int(line.split()[0]): line for line in table[1:]}
    for ident, label in kinds.labels.items():
        if ident in rows:
            assert f"  {label}  " in rows[ident], rows[ident]
    listed = json.loads(run_cli(*db, "--json", "candidates").stdout)
    assert {row["id"]: row["verdict_label"] for row in listed} == kinds.labels
    shown = run_cli(*db, "show", str(kinds.legacy_slower)).stdout.splitlines()
    assert "verdict: correct, slower" in shown
    assert not any(line.startswith("accepted:") for line in shown)
    assert json.loads(run_cli(*db, "show", str(kinds.slower), "--json").stdout)[
        "verdict_label"] == "correct, slower"


def test_cli_says_cpu_timings_are_indicative(kinds):
    db = ["--db", str(kinds.path)]
    runs = run_cli(*db, "runs").stdout.splitlines()
    assert runs[0].split()[-1] == "timings"
    by_id = {int(line.split()[0]): line for line in runs[1:]}
    assert by_id[kinds.cpu_run].endswith(CPU_TIMINGS)
    assert CPU_TIMINGS not in by_id[kinds.gpu_run]
    listed = json.loads(run_cli(*db, "--json", "runs").stdout)
    as_json = {run["id"]: run["timings_note"] for run in listed}
    assert as_json == {kinds.gpu_run: None, kinds.cpu_run: CPU_TIMINGS}
    best = run_cli(*db, "best", "--run", str(kinds.cpu_run)).stdout
    assert best.splitlines()[0] == f"run {kinds.cpu_run} ran on cpu: {CPU_TIMINGS}"
    assert CPU_TIMINGS not in run_cli(*db, "best", "--run", str(kinds.gpu_run)).stdout
    (row,) = json.loads(run_cli(*db, "best", "--json").stdout)
    assert (row["id"], row["timings_note"]) == (kinds.cpu_kernel, CPU_TIMINGS)


def test_a_cpu_run_is_told_by_its_gpu_field():
    assert cpu_timings("cpu") and cpu_timings("CPU (wall clock; CPU timings, not GPU)")
    assert not cpu_timings("NVIDIA H200") and not cpu_timings("cpuless accelerator")
