"""The Python API: `evaluate` keeps a warm worker, `Evaluator.evaluate_many` keeps a pool busy."""

from __future__ import annotations

import time
from pathlib import Path

from core.evaluate import EvalConfig, Evaluator, evaluate
from core.evaluate import evaluator as evaluator_module
from core.evaluate.verdict import Reason

DATA = Path(__file__).parent / "data" / "evaluate"
PROBLEM = DATA / "pointwise_problem.py"


def source(name: str) -> str:
    return (DATA / f"{name}.py").read_text()


def test_evaluate_many_preserves_order_across_workers():
    names = ["good_pointwise", "bad_missing_tail", "bad_thread", "good_pointwise",
             "bad_small_error", "bad_stale_output"]
    with Evaluator(EvalConfig(device="cpu", time=False), workers=2) as evaluator:
        verdicts = evaluator.evaluate_many([(PROBLEM, source(n)) for n in names])
        started = [w for w in evaluator.pool.workers if w is not None]
    assert [v.reason_code for v in verdicts] == [
        Reason.NOT_TIMED, Reason.UNWRITTEN_OUTPUT, Reason.STATIC_CHECK, Reason.NOT_TIMED,
        Reason.WRONG_VALUES, Reason.UNWRITTEN_OUTPUT,
    ]
    assert len(started) == 2
    assert all(v.eval_seconds > 0 for v in verdicts)


def test_two_workers_overlap_their_work():
    items = [(PROBLEM, source("bad_hang"))] * 2
    config = EvalConfig(device="cpu", time=False, compile_timeout_s=2, run_timeout_s=2)
    with Evaluator(config, workers=2) as evaluator:
        began = time.monotonic()
        verdicts = evaluator.evaluate_many(items)
        elapsed = time.monotonic() - began
    assert [v.reason_code for v in verdicts] == [Reason.TIMEOUT, Reason.TIMEOUT]
    assert elapsed < 0.75 * sum(v.eval_seconds for v in verdicts)


def test_static_rejections_start_no_worker():
    with Evaluator(EvalConfig(device="cpu"), workers=2) as evaluator:
        verdict = evaluator.evaluate(PROBLEM, source("bad_stream"))
        assert evaluator.pool.workers == [None, None]
    assert verdict.reason_code is Reason.STATIC_CHECK
    assert not verdict.compiled


def test_the_evaluate_function_reuses_its_worker_between_calls():
    """The same worker process judges both (no timing: a loaded machine makes any slow)."""
    config = EvalConfig(device="cpu", time=False)
    first = evaluate(PROBLEM, source("good_pointwise"), config)
    pool = evaluator_module._shared[repr(config)].pool
    workers = [worker.process.pid for worker in pool.workers if worker is not None]
    second = evaluate(PROBLEM, source("good_pointwise"), config)
    assert first.correct and second.correct
    assert len(workers) == 1
    assert [worker.process.pid for worker in pool.workers if worker is not None] == workers
    assert all(worker.alive for worker in pool.workers if worker is not None)
