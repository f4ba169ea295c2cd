"""A writer killed with `kill -9` loses nothing committed; its run is marked and resumable."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
from datetime import UTC, datetime, timedelta

import pytest
from store_fixture import REPO, assert_search_index_matches_records, fill_store, verdict

from core.runtime.errors import KilnInputError
from store import Store, open_reader

WRITER = """
import sys
from store import Store
from store_fixture import triton_candidate, verdict

with Store.open(sys.argv[1]) as store:
    run = store.start_run(model_spec="m.py", model_hash="h", gpu="H200", versions={}, config={})
    site = store.add_site(
        run, key="pointwise-00000000", family="pointwise", signature="relu(f32[8])",
        ops=["aten.relu.default"], calls=1, share=1.0, time_ms=1.0, eager_ms=1.0,
        compile_ms=1.0, floor_ms=0.1, problem_source="problem",
    )
    print("run", run, flush=True)
    if sys.argv[2] == "wait":
        sys.stdin.readline()
        sys.exit(0)
    parent, i = None, 0
    while True:
        new = store.add_candidate(site, parent_id=parent, tier="triton", generator="rules",
                                  rationale=f"variant {i}", source=triton_candidate(64 + i))
        print("candidate", new.id, flush=True)
        store.add_verdict(new.id, verdict(accepted=True, latency_ms=1.0 / (i + 1)))
        print("verdict", new.id, flush=True)
        parent, i = new.id, i + 1
"""


def start_writer(path, mode: str) -> tuple[subprocess.Popen[str], int]:
    writer = subprocess.Popen(
        [sys.executable, "-c", WRITER, str(path), mode],
        cwd=REPO,
        env={"PYTHONPATH": f"{REPO}:{REPO / 'tests'}", "PATH": "/usr/bin:/bin"},
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    first = writer.stdout.readline().split()
    assert first[:1] == ["run"], writer.stderr.read()
    return writer, int(first[1])


def stored_status(path, run_id: int) -> str:
    with sqlite3.connect(path) as conn:
        return conn.execute("SELECT status FROM runs WHERE id = ?", [run_id]).fetchone()[0]


def test_kill_9_loses_nothing_committed_and_the_run_resumes(tmp_path):
    path = tmp_path / "kiln.db"
    writer, run_id = start_writer(path, "write")
    committed: dict[str, list[int]] = {"candidate": [], "verdict": []}
    while len(committed["verdict"]) < 60:
        kind, ident = writer.stdout.readline().split()
        committed[kind].append(int(ident))
    writer.send_signal(signal.SIGKILL)
    writer.wait(timeout=30)
    assert writer.returncode == -signal.SIGKILL
    for line in writer.stdout.read().splitlines():
        kind, ident = line.split()
        committed[kind].append(int(ident))

    with open_reader(path) as reader:
        assert reader.run(run_id).status == "interrupted", "readers see the writer is gone"
    assert stored_status(path, run_id) == "running", "readers never write"

    with Store.open(path) as store:
        assert stored_status(path, run_id) == "interrupted"
        assert store.db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        state = store.resume_run(run_id)
        ids = [c.id for c in state.candidates]
        assert set(committed["candidate"]) <= set(ids)
        judged = {c.id for c in state.candidates if c.verdict is not None}
        assert set(committed["verdict"]) <= judged
        # At most the candidate being evaluated at the kill lacks its verdict.
        assert [c.id for c in state.unevaluated] in ([], [ids[-1]])
        assert (state.run.status, state.run.resumes) == ("running", 1)
        assert [site.key for site in state.sites] == ["pointwise-00000000"]

        child = store.add_candidate(
            state.sites[0].id, parent_id=ids[-1], tier="cuda", generator="rules",
            rationale="continue where it stopped", source="resumed source",
        )  # fmt: skip
        store.add_verdict(child.id, verdict(accepted=False, latency_ms=2.0, reason="slower"))
        store.finish_run(run_id, e2e={"speedup_vs_eager": 1.1})
        assert store.run(run_id).status == "done"
    assert_search_index_matches_records(path)


def test_a_live_writer_keeps_its_run_and_one_that_exits_early_loses_it(tmp_path):
    path = tmp_path / "kiln.db"
    writer, run_id = start_writer(path, "wait")
    try:
        with Store.open(path) as store:
            assert store.run(run_id).status == "running"
            with pytest.raises(KilnInputError, match=f"it is running by pid {writer.pid}"):
                store.resume_run(run_id)
            with pytest.raises(ValueError, match=f"it is written by pid {writer.pid}"):
                store.heartbeat(run_id)
    finally:
        writer.communicate("exit\n", timeout=30)
    assert writer.returncode == 0
    with Store.open(path) as store:
        assert store.run(run_id).status == "interrupted"
        assert store.resume_run(run_id).run.status == "running"


def test_a_reused_pid_does_not_keep_a_dead_run_alive(tmp_path):
    filled = fill_store(tmp_path / "kiln.db")
    with sqlite3.connect(filled.path) as conn:
        conn.execute(
            "UPDATE runs SET writer_pid = ?, writer_token = 'a-previous-boot:12345'",
            [os.getpid()],
        )
    with Store.open(filled.path) as store:
        assert store.run(filled.run).status == "interrupted"


def test_a_run_written_from_another_host_is_judged_by_its_heartbeat(tmp_path):
    filled = fill_store(tmp_path / "kiln.db")
    now = datetime.now(UTC)
    with Store.open(filled.path) as store:
        second = store.start_run(
            model_spec="b.py", model_hash="2", gpu="H200", versions={}, config={}
        )
    with sqlite3.connect(filled.path) as conn:
        for run_id, silent in ((filled.run, timedelta(minutes=20)), (second, timedelta(minutes=1))):
            conn.execute(
                "UPDATE runs SET writer_host = 'gpu-node-7', heartbeat_at = ? WHERE id = ?",
                [(now - silent).isoformat(), run_id],
            )
    with Store.open(filled.path) as store:
        assert [store.run(r).status for r in (filled.run, second)] == ["interrupted", "running"]


def test_a_finished_run_cannot_be_resumed(tmp_path):
    filled = fill_store(tmp_path / "kiln.db")
    with Store.open(filled.path) as store:
        store.finish_run(filled.run, e2e={})
        with pytest.raises(KilnInputError, match="it is done"):
            store.resume_run(filled.run)
