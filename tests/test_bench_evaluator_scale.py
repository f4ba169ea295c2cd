"""The scale bench's sittings: a run still going after its sitting is interrupted as Ctrl-C
would, and the bench finds a problem's interrupted run to go on with."""

from __future__ import annotations

import subprocess
import sys

from bench.evaluator_scale_bench import Row, interrupted_run, optimize, table, verdict_lines
from store import open_reader
from store.writer import Store
from tests.store_fixture import fill_store
from tests.test_list_sites_cli import ROOT

# Stands for `python -m core.optimize`: takes SIGINT however it was started, searches until
# Ctrl-C, then stores and exits 130.
SEARCHING = """
import signal, sys, time
signal.signal(signal.SIGINT, signal.default_int_handler)
try:
    time.sleep(120)
except KeyboardInterrupt:
    print("stored what it was judging")
    sys.exit(130)
"""

START_RUN = """
import sys
from store.writer import Store
with Store.open(sys.argv[1]) as store:
    store.start_run(model_spec="m.py", model_hash="0", gpu="-", versions={}, config={})
"""


def test_a_run_past_its_sitting_is_interrupted_and_waited_for():
    roots: dict[int, str] = {}
    # A sitting of 3 s: the stand-in is searching by then, even on a loaded machine.
    returncode, stdout, _ = optimize([sys.executable, "-c", SEARCHING], 0.05, "p", roots)
    assert (returncode, stdout) == (130, "stored what it was judging\n")
    assert list(roots.values()) == ["p"]


def test_a_run_within_its_sitting_runs_to_its_end():
    returncode, stdout, _ = optimize([sys.executable, "-c", "print('done')"], 1.0, "p", {})
    assert (returncode, stdout) == (0, "done\n")


def test_only_a_stores_interrupted_latest_run_is_gone_on_with(tmp_path):
    db = tmp_path / "kiln.db"
    assert interrupted_run(db) is None  # no store: the problem starts anew
    # A run whose process ended without finishing it reads as interrupted.
    subprocess.run([sys.executable, "-c", START_RUN, str(db)], cwd=ROOT, check=True)
    assert interrupted_run(db) == 1
    with Store.open(db) as store:  # a later run of the problem, done
        later = store.start_run(model_spec="m.py", model_hash="0", gpu="-", versions={},
                                config={})
        store.finish_run(later, status="done")
    assert interrupted_run(db) is None


def test_each_verdict_is_a_line_with_its_reason(tmp_path):
    filled = fill_store(tmp_path / "kiln.db")
    with open_reader(filled.path) as reader:
        candidates = [reader.candidate(c.id) for s in reader.sites(filled.run)
                      for c in reader.candidates(site_id=s.id)]
    lines = verdict_lines(candidates).splitlines()
    judged = [c for c in candidates if c.verdict]
    assert len(lines) == len(judged) and len(judged) < len(candidates)  # pending: no line
    (mismatch,) = [line for line in lines if line.startswith(f"{filled.mismatch} ")]
    wrong = next(c for c in judged if c.id == filled.mismatch)
    verdict, summary = wrong.verdict, wrong.summary
    origin = f"from {summary.parent_id}" if summary.parent_id is not None else "draft"
    assert mismatch == (f"{filled.mismatch} triton {verdict['reason_code']}: "
                        f"{' '.join(verdict['reason'].split())} · {origin}: "
                        f"{' '.join(summary.rationale.split())}")
    (faster,) = [line for line in lines if line.startswith(f"{filled.faster} ")]
    assert faster.startswith(f"{filled.faster} triton accepted: 0.5 ms"), faster


def test_the_table_has_a_cell_under_each_heading():
    row = Row("p", "ok", judged=3, per_minute=1.5, io_gb=2.0, memory_ratio=2.5,
              run_peak_gb=9.0, own_peak_gb=1.25, problem_io_gb=2.0, minutes=1.0)
    header, rule, line = table([row, Row("q", "exit 1: x")]).splitlines()[:3]
    cells = dict(zip(header.strip("|").split("|"), line.strip("|").split("|"), strict=True))
    assert cells[" run peak GB "] == " 9.0 " and cells[" its own GB "] == " 1.2 "
    assert rule.count("---") == header.count("|") - 1
    unmeasured = table([Row("q", "exit 1: x")]).splitlines()[2].strip("|").split("|")
    assert [c.strip() for c in unmeasured].count("-") == 3  # peak / io, run peak, its own
