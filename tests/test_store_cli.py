"""`python -m store`: every command as a table and as JSON, the store from --db or $KILN_DB."""

from __future__ import annotations

import json

from store_fixture import fill_store, run_cli, triton_candidate

from store import Store

SUMMARY_KEYS = {
    "id", "parent_id", "site_id", "family", "tier", "generator", "accepted", "latency_ms",
    "speedup",
}  # fmt: skip


def cli_json(*args: str, env: dict[str, str] | None = None):
    result = run_cli(*args, env=env)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def test_runs_lists_each_run_with_its_counts(tmp_path):
    filled = fill_store(tmp_path / "kiln.db")
    (run,) = cli_json("runs", "--json", env={"KILN_DB": str(filled.path)})
    assert (run["id"], run["model_spec"], run["gpu"]) == (
        filled.run,
        "examples/block.py",
        "NVIDIA H200",
    )
    assert (run["sites"], run["candidates"], run["accepted"]) == (2, 5, 2)
    # The run's writer (this test process) is alive, so the run is still running.
    assert run["status"] == "running"
    table = run_cli("--db", str(filled.path), "runs").stdout.splitlines()
    assert table[0].split() == [
        "id",
        "model_spec",
        "gpu",
        "status",
        "started_at",
        "sites",
        "candidates",
        "accepted",
        "timings",
    ]
    assert table[1].split()[:2] == [str(filled.run), "examples/block.py"]


def test_candidates_of_the_store_a_run_or_a_site(tmp_path):
    filled = fill_store(tmp_path / "kiln.db")
    db = ["--db", str(filled.path)]
    everything = cli_json(*db, "--json", "candidates")
    assert all(row.keys() >= SUMMARY_KEYS for row in everything)
    assert [row["id"] for row in everything] == [
        filled.draft, filled.faster, filled.mismatch, filled.pending, filled.broken,
    ]  # fmt: skip
    faster = everything[1]
    assert (faster["parent_id"], faster["site_id"], faster["family"]) == (
        filled.draft,
        filled.pointwise,
        "pointwise",
    )
    assert (faster["tier"], faster["generator"], faster["accepted"]) == ("triton", "rules", True)
    assert (faster["latency_ms"], faster["speedup"]) == (0.5, 2.0)
    assert everything[3]["accepted"] is None, "a candidate without a verdict"

    of_site = cli_json(*db, "candidates", "--site", str(filled.reduction), "--json")
    assert [row["id"] for row in of_site] == [filled.broken]
    assert len(cli_json(*db, "candidates", "--run", str(filled.run), "--limit", "2", "--json")) == 2


def test_show_gives_source_and_full_verdict(tmp_path):
    filled = fill_store(tmp_path / "kiln.db")
    db = ["--db", str(filled.path)]
    shown = cli_json(*db, "show", str(filled.faster), "--json")
    assert shown["source"] == triton_candidate(256)
    assert shown["verdict"]["timing_device"] == "NVIDIA H200"
    assert shown.keys() >= SUMMARY_KEYS
    text = run_cli(*db, "show", str(filled.mismatch)).stdout
    assert "reason: max relative error 0.5 above the fp32 tolerance" in text
    assert '"reason_code": "wrong_values"' in text
    assert text.endswith(f"source:\n{store_source(filled.path, filled.mismatch)}\n")


def store_source(path, candidate_id: int) -> str:
    with Store.open(path) as store:
        return store.candidate(candidate_id).source


def test_best_gives_the_fastest_accepted_per_site_of_the_latest_run(tmp_path):
    filled = fill_store(tmp_path / "kiln.db")
    db = ["--db", str(filled.path)]
    (best,) = cli_json(*db, "best", "--json")
    assert (best["id"], best["site_key"], best["speedup_vs_compile"]) == (
        filled.faster,
        "pointwise-1a2b3c4d",
        1.8,
    )
    with Store.open(filled.path) as store:
        newer = store.start_run(
            model_spec="b.py", model_hash="2", gpu="H200", versions={}, config={}
        )
    assert cli_json(*db, "best", "--json") == []
    assert [row["id"] for row in cli_json(*db, "best", "--run", str(filled.run), "--json")] == [
        filled.faster
    ]
    assert run_cli(*db, "best", "--run", str(newer)).stdout == "no accepted candidate yet\n"


def add_run_with_site(path, key: str) -> tuple[int, int]:
    """A second run profiling a site of the same key; its run id and its one candidate's id."""
    with Store.open(path) as store:
        run = store.start_run(model_spec="b.py", model_hash="2", gpu="H200", versions={}, config={})
        site = store.add_site(
            run, key=key, family="reduction", signature="softmax(f32[16,1000], dim=-1)",
            ops=["aten._softmax.default"], calls=2, share=0.1, time_ms=None, eager_ms=None,
            compile_ms=None, floor_ms=None, problem_source="problem",
        )  # fmt: skip
        candidate = store.add_candidate(
            site, parent_id=None, tier="triton", generator="rules", rationale="again",
            source=triton_candidate(64),
        ).id  # fmt: skip
    return run, candidate


def test_candidates_of_a_site_by_its_key_in_every_run_or_one(tmp_path):
    filled = fill_store(tmp_path / "kiln.db")
    db = ["--db", str(filled.path)]
    of_key = cli_json(*db, "--json", "candidates", "--site", "pointwise-1a2b3c4d")
    assert [row["id"] for row in of_key] == [
        filled.draft, filled.faster, filled.mismatch, filled.pending
    ]  # fmt: skip
    newer, again = add_run_with_site(filled.path, "reduction-5e6f7a8b")
    every_run = cli_json(*db, "--json", "candidates", "--site", "reduction-5e6f7a8b")
    assert [row["id"] for row in every_run] == [filled.broken, again]
    one_run = cli_json(*db, "--json", "candidates", "--site", "reduction-5e6f7a8b", "--run",
                       str(newer))  # fmt: skip
    assert [row["id"] for row in one_run] == [again]
    assert "unless --run picks one" in " ".join(run_cli("candidates", "--help").stdout.split())


def test_empty_listings_say_so_in_one_lowercase_line(tmp_path):
    filled = fill_store(tmp_path / "kiln.db")
    db = ["--db", str(filled.path)]
    newer, _ = add_run_with_site(filled.path, "reduction-00000000")
    with Store.open(filled.path) as store:
        empty_run = store.start_run(
            model_spec="c.py", model_hash="3", gpu="H200", versions={}, config={}
        )
    listings = {
        ("candidates", "--run", str(empty_run)): "no candidates",
        ("search", "cutlass"): "no matches",
        ("search", "--fts", "cutlass"): "no matches",
        ("best", "--run", str(newer)): "no accepted candidate yet",
    }
    for args, message in listings.items():
        result = run_cli(*db, *args)
        assert (result.returncode, result.stdout, result.stderr) == (0, f"{message}\n", ""), args
        assert cli_json(*db, *args, "--json") == [], args
    Store.open(tmp_path / "empty.db").close()
    assert run_cli("--db", str(tmp_path / "empty.db"), "runs").stdout == "no runs yet\n"
