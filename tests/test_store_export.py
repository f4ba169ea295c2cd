"""Exports: KernelBench pairs that `core.evaluate` accepts, and JSON/CSV with every record."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys

import pytest
from store_fixture import POINTWISE_PROBLEM, REPO, fill_store, run_cli, triton_candidate

from core.runtime.errors import KilnInputError
from store import Store, export, open_reader


def test_kernelbench_export_writes_each_site_with_its_fastest_accepted_kernel(tmp_path):
    filled = fill_store(tmp_path / "kiln.db")
    out = tmp_path / "kb"
    with open_reader(filled.path) as store:
        written = export(store, "kernelbench", out)
    site = out / "pointwise-1a2b3c4d"
    assert sorted(written) == [site / "model_new.py", site / "problem.py"]
    assert (site / "problem.py").read_text() == POINTWISE_PROBLEM
    assert (site / "model_new.py").read_text() == triton_candidate(256)
    assert not (out / "reduction-5e6f7a8b").exists(), "a site without an accepted kernel"


def test_kernelbench_export_round_trips_through_the_evaluator(tmp_path):
    filled = fill_store(tmp_path / "kiln.db")
    out = tmp_path / "kb"
    exported = run_cli(
        "--db", str(filled.path), "export", "--format", "kernelbench", "--out", str(out)
    )
    assert exported.returncode == 0, exported.stderr
    site = out / "pointwise-1a2b3c4d"
    problem, solution = str(site / "problem.py"), str(site / "model_new.py")
    result = subprocess.run(
        [sys.executable, "-m", "core.evaluate", problem, solution, "--device", "cpu", "--json"],
        cwd=REPO,
        env={**os.environ, "TRITON_INTERPRET": "1"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    judged = json.loads(result.stdout)
    # Correct; on the CPU the interpreter is slower than PyTorch, so accepted only on a GPU.
    assert judged["correct"] and judged["reason_code"] in ("", "slower"), judged
    assert result.returncode == (0 if judged["accepted"] else 1), result.stderr

    with Store.open(filled.path) as store:
        store.add_verdict(filled.faster, judged)
        stored = store.candidate(filled.faster)
    assert stored.verdict == judged
    assert stored.summary.latency_ms == pytest.approx(judged["latency_ms"])


def test_json_export_carries_every_candidate_and_verdict(tmp_path):
    filled = fill_store(tmp_path / "kiln.db")
    with open_reader(filled.path) as store:
        (path,) = export(store, "json", tmp_path / "out")
        records = json.loads(path.read_text())
        assert [c["id"] for c in records["candidates"]] == [c.id for c in store.candidates()]
        for row in records["candidates"]:
            assert row["source"] == store.candidate(row["id"]).source
        by_candidate = {v["candidate_id"]: v["verdict"] for v in records["verdicts"]}
        assert sorted(by_candidate) == sorted(
            {filled.draft, filled.faster, filled.mismatch, filled.broken}
        )
        for candidate_id, verdict in by_candidate.items():
            assert verdict == store.candidate(candidate_id).verdict
    assert [r["id"] for r in records["runs"]] == [filled.run]
    assert records["runs"][0]["config"] == {"budget": 64, "tiers": ["triton", "cuda"]}
    assert [s["key"] for s in records["sites"]] == ["pointwise-1a2b3c4d", "reduction-5e6f7a8b"]
    assert [c["id"] for c in records["llm_calls"]] == [filled.llm_call]


def test_csv_export_carries_every_candidate_and_verdict(tmp_path):
    filled = fill_store(tmp_path / "kiln.db")
    with open_reader(filled.path) as store:
        written = export(store, "csv", tmp_path / "out")
        assert sorted(p.name for p in written) == [
            "candidates.csv", "llm_calls.csv", "models.csv", "runs.csv", "sites.csv",
            "verdicts.csv",
        ]  # fmt: skip
        with (tmp_path / "out" / "candidates.csv").open(newline="") as handle:
            candidates = list(csv.DictReader(handle))
        assert [int(row["id"]) for row in candidates] == [c.id for c in store.candidates()]
        for row in candidates:
            assert row["source"] == store.candidate(int(row["id"])).source
        with (tmp_path / "out" / "verdicts.csv").open(newline="") as handle:
            verdicts = list(csv.DictReader(handle))
    assert len(verdicts) == 4
    mismatch = next(v for v in verdicts if int(v["candidate_id"]) == filled.mismatch)
    assert (mismatch["reason_code"], mismatch["accepted"]) == ("wrong_values", "0")


def test_export_of_one_run_leaves_the_others_out(tmp_path):
    filled = fill_store(tmp_path / "kiln.db")
    with Store.open(filled.path) as store:
        other = store.start_run(
            model_spec="b.py", model_hash="2", gpu="H200", versions={}, config={}
        )
        store.add_site(
            other, key="other-00000000", family="other", signature="s", ops=[], calls=1,
            share=0.1, time_ms=None, eager_ms=None, compile_ms=None, floor_ms=None,
            problem_source="p",
        )  # fmt: skip
        (path,) = export(store, "json", tmp_path / "one", run_id=filled.run)
        records = json.loads(path.read_text())
        assert {s["run_id"] for s in records["sites"]} == {filled.run}
        assert [r["id"] for r in records["runs"]] == [filled.run]
        with pytest.raises(KilnInputError, match=f"run {other} has no accepted candidate"):
            export(store, "kernelbench", tmp_path / "kb")
