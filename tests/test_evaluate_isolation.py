"""A crash, a hang or running out of memory costs only the worker; the next candidate runs."""

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
    config = EvalConfig(device="cpu", time=False, compile_timeout_s=20, run_timeout_s=20)
    with Evaluator(config, workers=1) as shared:
        yield shared


@pytest.mark.parametrize(
    ("candidate", "code", "flag"),
    [
        ("bad_segfault", Reason.CRASH, "crashed"),
        ("bad_oom", Reason.OUT_OF_MEMORY, None),
    ],
)
def test_a_failing_worker_is_replaced_and_the_next_candidate_is_judged(evaluator, candidate,
                                                                      code, flag):
    before = evaluator.replacements
    bad, good = evaluator.evaluate_many([(PROBLEM, (DATA / f"{candidate}.py").read_text()),
                                         (PROBLEM, GOOD)])
    assert bad.reason_code is code, bad.reason
    if flag:
        assert getattr(bad, flag)
    assert good.correct, good.reason
    assert evaluator.replacements == before + 1


def test_a_crash_names_the_signal(evaluator):
    verdict = evaluator.evaluate(PROBLEM, (DATA / "bad_segfault.py").read_text())
    assert "signal SIGSEGV" in verdict.reason


def test_a_hang_times_out_and_the_evaluator_goes_on():
    config = EvalConfig(device="cpu", time=False, compile_timeout_s=3, run_timeout_s=3)
    with Evaluator(config, workers=1) as evaluator:
        hung, good = evaluator.evaluate_many([(PROBLEM, (DATA / "bad_hang.py").read_text()),
                                              (PROBLEM, GOOD)])
        assert evaluator.replacements == 1
    assert hung.reason_code is Reason.TIMEOUT and hung.timed_out
    assert "time limit of 3s" in hung.reason
    assert hung.eval_seconds >= 3
    assert good.correct, good.reason


def test_a_healthy_worker_is_reused(evaluator):
    evaluator.evaluate(PROBLEM, GOOD)
    worker = evaluator.pool.workers[0]
    assert worker is not None
    pid = worker.process.pid
    evaluator.evaluate(PROBLEM, GOOD)
    assert evaluator.pool.workers[0].process.pid == pid
