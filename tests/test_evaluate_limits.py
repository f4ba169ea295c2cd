"""Physical limits and failures of the run itself: a time under the byte floor is impossible;
a failure of Kiln's own judging is one candidate's verdict; Ctrl-C ends a batch at once; a site's
eager baseline can be timed alone."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import pytest

from core.evaluate import EvalConfig, Evaluator
from core.evaluate.evaluator import job
from core.evaluate.pool import WorkerPool
from core.evaluate.site_baseline import time_site
from core.evaluate.verdict import Reason
from core.evaluate.worker import WorkerError

DATA = Path(__file__).parent / "data" / "evaluate"
PROBLEM = DATA / "pointwise_problem.py"
GOOD = (DATA / "good_pointwise.py").read_text()


def test_a_time_under_the_byte_floor_is_rejected_and_flagged():
    """On a fake device of a few bytes a second every honest time is 'impossibly fast'; on the
    CPU by default no floor applies (its timings say nothing of a GPU's)."""
    slow = EvalConfig(device="cpu", bandwidth_tbps=1e-15)
    with Evaluator(slow) as evaluator:
        impossible = evaluator.evaluate(PROBLEM, GOOD)
    assert impossible.reason_code is Reason.BELOW_FLOOR, impossible.reason
    assert impossible.flagged and not impossible.accepted
    assert "under the byte floor" in impossible.reason
    assert not EvalConfig(device="cpu").floor_applies
    assert EvalConfig(device="cuda").floor_applies


def test_a_failure_of_the_judging_itself_is_that_candidates_verdict():
    def broken(on_worker):
        raise WorkerError("the judge fell over")

    pool = WorkerPool(EvalConfig(device="cpu", time=False), workers=1)
    try:
        failed, good = pool.map([broken, job(PROBLEM, GOOD, pool.config)])
    finally:
        pool.close()
    assert failed.reason_code is Reason.JUDGE_ERROR and "fell over" in failed.reason
    assert good.correct, good.reason


def test_ctrl_c_takes_no_pending_job_and_kills_the_busy_worker():
    config = EvalConfig(device="cpu", time=False, compile_timeout_s=600, run_timeout_s=600,
                        cpu_timeout_s=600)
    pool = WorkerPool(config, workers=1)
    started = threading.Event()
    judged: list[str] = []

    def hang(on_worker):
        started.set()
        return job(PROBLEM, (DATA / "bad_hang.py").read_text(), config)(on_worker)

    def good(on_worker):
        judged.append("good")
        return job(PROBLEM, GOOD, config)(on_worker)

    def interrupt():
        started.wait(120)
        time.sleep(1)  # the hang is in the worker's hands by now, or soon
        os.kill(os.getpid(), signal.SIGINT)

    # A shell's background jobs ignore SIGINT; a terminal's Ctrl-C raises KeyboardInterrupt.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    threading.Thread(target=interrupt, daemon=True).start()
    began = time.monotonic()
    try:
        with pytest.raises(KeyboardInterrupt):
            pool.map([hang, good, good])
        assert time.monotonic() - began < 300  # far under the hang's limits
        assert judged == []
        assert not pool.workers[0].alive
    finally:
        signal.signal(signal.SIGINT, previous)
        pool.close()


def test_a_sites_eager_baseline_can_be_timed_without_compiling():
    config = EvalConfig(device="cpu", trials=2, warmup=1)
    eager = time_site(PROBLEM, config, compile=False)
    assert eager.compile_ms is None and eager.best_ms == eager.eager_ms > 0
