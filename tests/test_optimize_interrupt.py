"""Ctrl-C mid-search: the workers stop, the run is left interrupted with one line on how to
resume it, exit code 130; `--resume RUN` then goes on to the run's own budget."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from datetime import datetime, timedelta
from pathlib import Path

from bench.processes import process_table
from store import open_reader
from tests.test_list_sites_cli import ROOT, run_cli
from tests.test_optimize_resume import judged, stored

SEARCH = ["tests.models:make_mlp", "--device", "cpu", "--sites", "1", "--workers", "1",
          "--trials", "2", "--warmup", "0", "--no-e2e", "--no-site-compile"]


def children(pid: int) -> set[int]:
    """The processes whose parent is `pid` (the evaluator's workers of a run)."""
    return {child for child, stat in process_table().items() if stat.parent == pid}


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")


def interrupted_run(tmp_path: Path, *flags: str) -> tuple[Path, subprocess.CompletedProcess]:
    """A run sent Ctrl-C as a terminal sends it, to its whole process group, once it has
    judged a few kernels; the run's store and what the command did."""
    db = tmp_path / "kiln.db"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    command = [sys.executable, "-m", "core.optimize", *SEARCH, "--db", str(db), "--out",
               str(tmp_path / "out"), *flags]
    process = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, start_new_session=True)
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and process.poll() is None and judged(db) < 2:
        time.sleep(0.2)
    assert process.poll() is None, "the run finished before it could be interrupted"
    workers = children(process.pid)
    assert workers, "no evaluator worker was running"
    os.killpg(process.pid, signal.SIGINT)
    out, err = process.communicate(timeout=240)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and any(alive(pid) for pid in workers):
        time.sleep(0.2)
    assert not any(alive(pid) for pid in workers), "a worker outlived the interrupted run"
    return db, subprocess.CompletedProcess(command, process.returncode, out, err)


def test_ctrl_c_leaves_the_run_interrupted_and_says_how_to_resume(tmp_path):
    db, result = interrupted_run(tmp_path, "--max-candidates", "8")
    assert result.returncode == 130, result.stderr
    assert "Traceback" not in result.stderr
    assert f"python -m core.optimize --resume 1 --db {db}" in result.stderr.splitlines()[-1]
    with open_reader(db) as reader:
        assert reader.run(1).status == "interrupted"
    assert all(verdict is not None for *_, verdict in stored(db)), \
        "a kernel being judged at Ctrl-C was stored without its verdict"

    before = len(stored(db))
    resumed = run_cli("--resume", "1", "--db", str(db), "--json")
    assert resumed.returncode == 0, resumed.stderr
    report = json.loads(resumed.stdout)
    # The run's own --max-candidates 8 holds: unbounded, the site's search goes on until 12
    # kernels in a row bring no new best.
    assert before < len(stored(db)) <= 8
    assert report["searched"][0]["evaluations"] == len(stored(db))
    with open_reader(db) as reader:
        assert reader.run(1).status == "done"


def test_the_minutes_a_run_already_ran_count_against_its_budget(tmp_path):
    db, result = interrupted_run(tmp_path, "--max-candidates", "30", "--budget", "2")
    assert result.returncode == 130, result.stderr
    # As if it had run three minutes before Ctrl-C: its two are spent.
    with sqlite3.connect(db) as connection:
        (last_seen,) = connection.execute("SELECT heartbeat_at FROM runs").fetchone()
        start = datetime.fromisoformat(last_seen) - timedelta(minutes=3)
        connection.execute("UPDATE runs SET started_at = ?", [start.isoformat()])
    before = stored(db)
    resumed = run_cli("--resume", "1", "--db", str(db), "--json")
    assert resumed.returncode == 0, resumed.stderr
    assert stored(db) == before, "the resumed run judged kernels past its budget"
    with open_reader(db) as reader:
        assert reader.run(1).status == "done"
