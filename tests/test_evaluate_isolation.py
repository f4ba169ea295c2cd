"""A crash, a hang or running out of memory costs only the candidate's own process: the judge,
its worker, goes on with the next candidate."""

from __future__ import annotations

from pathlib import Path

import pytest

from core.evaluate import EvalConfig, Evaluator
from core.evaluate.verdict import Reason

DATA = Path(__file__).parent / "data" / "evaluate"
PROBLEM = DATA / "pointwise_problem.py"
GOOD = (DATA / "good_pointwise.py").read_text()


@pytest.fixture(scope="module")
def evaluator():
    config = EvalConfig(device="cpu", time=False, compile_timeout_s=60, run_timeout_s=60)
    with Evaluator(config, workers=1) as shared:
        yield shared


def worker_pid(evaluator: Evaluator) -> int:
    worker = evaluator.pool.workers[0]
    assert worker is not None and worker.alive
    return worker.process.pid


@pytest.mark.parametrize(
    ("candidate", "code", "flag"),
    [
        ("bad_segfault", Reason.CRASH, "crashed"),
        ("bad_oom", Reason.OUT_OF_MEMORY, None),
    ],
)
def test_a_failing_candidate_costs_only_its_process_and_the_next_is_judged(evaluator, candidate,
                                                                           code, flag):
    evaluator.evaluate(PROBLEM, GOOD)
    pid = worker_pid(evaluator)
    bad, good = evaluator.evaluate_many([(PROBLEM, (DATA / f"{candidate}.py").read_text()),
                                         (PROBLEM, GOOD)])
    assert bad.reason_code is code, bad.reason
    if flag:
        assert getattr(bad, flag)
    assert good.correct, good.reason
    assert evaluator.replacements == 0 and worker_pid(evaluator) == pid


def test_a_crash_names_the_signal(evaluator):
    verdict = evaluator.evaluate(PROBLEM, (DATA / "bad_segfault.py").read_text())
    assert "signal SIGSEGV" in verdict.reason


def test_a_hang_times_out_on_cpu_time_and_the_evaluator_goes_on():
    """The limit is on the candidate's CPU seconds, which a busy loop spends at the rate the
    machine lets it: a loaded machine makes the test longer, never a different verdict. The
    wall-clock limits are far away, for the honest candidate after it."""
    config = EvalConfig(device="cpu", time=False, compile_timeout_s=300, run_timeout_s=300,
                        cpu_timeout_s=3)
    with Evaluator(config, workers=1) as evaluator:
        hung, good = evaluator.evaluate_many([(PROBLEM, (DATA / "bad_hang.py").read_text()),
                                              (PROBLEM, GOOD)])
        assert evaluator.replacements == 0
    assert hung.reason_code is Reason.TIMEOUT and hung.timed_out, hung.reason
    assert "CPU time limit of 3s" in hung.reason
    assert hung.eval_seconds >= 3
    assert good.correct, good.reason


def test_a_healthy_worker_is_reused(evaluator):
    evaluator.evaluate(PROBLEM, GOOD)
    pid = worker_pid(evaluator)
    evaluator.evaluate(PROBLEM, GOOD)
    assert worker_pid(evaluator) == pid
