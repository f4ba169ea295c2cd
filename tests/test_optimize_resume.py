"""A run killed with -9 mid-search loses nothing committed and `--resume RUN` continues it."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time

from tests.test_list_sites_cli import ROOT, run_cli


def stored(db) -> list[tuple]:
    with sqlite3.connect(db) as connection:
        return connection.execute(
            "SELECT c.id, c.parent_id, c.source_hash, c.verdict_id FROM candidates c "
            "ORDER BY c.id").fetchall()


def judged(db) -> int:
    """Candidates stored with their verdict so far; none while the run has not made its
    tables yet (the file exists a moment before its schema does)."""
    if not db.exists():
        return 0
    with sqlite3.connect(db) as connection:
        if connection.execute(
                "SELECT 1 FROM sqlite_master WHERE name = 'candidates'").fetchone() is None:
            return 0
    return len([r for r in stored(db) if r[3] is not None])


def test_kill_minus_9_then_resume_finishes_the_same_run(tmp_path):
    db, out = tmp_path / "kiln.db", tmp_path / "out"
    args = ["tests.models:make_mlp", "--device", "cpu", "--db", str(db), "--sites", "1",
            "--max-candidates", "10", "--workers", "1", "--trials", "2", "--warmup", "0",
            "--out", str(out), "--no-e2e", "--no-site-compile"]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    writer = subprocess.Popen([sys.executable, "-m", "core.optimize", *args], cwd=ROOT, env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and writer.poll() is None:
        if judged(db) >= 3:
            break
        time.sleep(0.2)
    assert writer.poll() is None, "the run finished before it could be killed"
    writer.send_signal(signal.SIGKILL)
    writer.wait()
    before = stored(db)
    assert len(before) >= 3

    result = run_cli("--resume", "1", "--db", str(db), "--max-candidates", "10", "--workers",
                     "1", "--trials", "2", "--warmup", "0", "--json", "--no-e2e")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["run_id"] == 1 and report["resumed"] is True
    after = stored(db)
    assert after[: len(before)] == [
        (cid, parent, digest, verdict if verdict is not None else after[i][3])
        for i, (cid, parent, digest, verdict) in enumerate(before)
    ], "a candidate stored before the kill changed"
    assert len(after) <= 10 and len(after) > len(before)
    assert len({r[2] for r in after}) == len(after), "a kernel was proposed twice"
    ids = {r[0] for r in after}
    assert all(r[3] is not None for r in after), "a candidate without its verdict"
    assert all(r[1] is None or r[1] in ids for r in after)
    with sqlite3.connect(db) as connection:
        status, resumes = connection.execute("SELECT status, resumes FROM runs").fetchone()
    assert (status, resumes) == ("done", 1)


def test_resume_of_a_finished_run_is_refused(tmp_path):
    db = tmp_path / "kiln.db"
    first = run_cli("tests.models:make_mlp", "--device", "cpu", "--db", str(db), "--sites",
                    "1", "--max-candidates", "2", "--workers", "1", "--trials", "1",
                    "--warmup", "0", "--out", str(tmp_path / "out"))
    assert first.returncode == 0, first.stderr
    again = run_cli("--resume", "1", "--db", str(db))
    assert again.returncode == 2 and "cannot be resumed: it is done" in again.stderr
