"""Evaluation as Ray tasks on a local cluster of CPU workers, Triton under its interpreter.

Equivalence with the local pool is checked twice. The same batch of real candidates gets the
same verdicts through both executors. And the real optimize run (profile, search, store) on a
one-site model grows the same tree through both: its verdicts are real but untimed
(`EvalConfig.time=False`), because CPU timings are noise that would steer the two searches
apart; each accepted kernel's latency is instead a fixed function of its source, so the tree
grows deep and any dependence on which task finished first would show. `submit`, which the run
keeps its workers busy with, gives the same verdicts on Ray as `evaluate_many`.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
from concurrent.futures import Future
from dataclasses import replace
from pathlib import Path

import pytest

ray = pytest.importorskip("ray", reason="Ray is not installed (pip install 'kiln[ray]')")

from core.evaluate import EvalConfig, Evaluator  # noqa: E402 - after the skip
from core.evaluate.ray_executor import RayEvaluator, job_runtime_env  # noqa: E402
from core.evaluate.verdict import Reason, Verdict  # noqa: E402
from core.optimize.cli import main as optimize_main  # noqa: E402
from core.optimize.run import OptimizeRun  # noqa: E402

DATA = Path(__file__).parent / "data" / "evaluate"
PROBLEM = DATA / "pointwise_problem.py"
BATCH = ["good_pointwise", "bad_missing_tail", "bad_thread", "bad_small_error",
         "bad_stale_output", "bad_mutates_input", "bad_segfault", "good_pointwise"]
# One input seed for both evaluators: the verdicts compared hold the seeds they were drawn from.
UNTIMED = EvalConfig(device="cpu", time=False, input_seed=0)


@pytest.fixture(scope="module")
def cluster():
    ray.init(num_cpus=2, include_dashboard=False, runtime_env=job_runtime_env(),
             log_to_driver=False)
    yield
    ray.shutdown()


def items(names: list[str], problem: Path = PROBLEM) -> list[tuple[Path, str]]:
    return [(problem, (DATA / f"{name}.py").read_text()) for name in names]


def summary(verdict: Verdict) -> tuple:
    return (verdict.reason_code, verdict.accepted, verdict.compiled, verdict.tier,
            verdict.trials_checked, verdict.max_abs_err, verdict.max_rel_err)


def test_a_batch_gets_the_same_verdicts_as_on_the_local_pool(cluster):
    with Evaluator(UNTIMED, workers=1) as local:
        expected = local.evaluate_many(items(BATCH))
    with RayEvaluator(UNTIMED) as remote:
        got = remote.evaluate_many(items(BATCH))
        one_by_one = [f.result() for f in remote.submit(items(BATCH))]
        assert remote.retries == 0
    assert [summary(v) for v in one_by_one] == [summary(v) for v in got]
    assert [v.reason_code for v in got] == [
        Reason.NOT_TIMED, Reason.UNWRITTEN_OUTPUT, Reason.STATIC_CHECK, Reason.WRONG_VALUES,
        Reason.UNWRITTEN_OUTPUT, Reason.MUTATED_INPUT, Reason.CRASH, Reason.NOT_TIMED]
    assert [summary(v) for v in got] == [summary(v) for v in expected]
    assert "SIGSEGV" in got[6].reason
    assert all(v.eval_seconds > 0 for v in got)


KILLER_PROBLEM = '''
import os
import signal

import torch
import torch.nn as nn

N = 1037


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        try:
            os.close(os.open({marker!r}, os.O_CREAT | os.O_EXCL))
        except FileExistsError:
            return
        # The first judge to build this model kills the Ray worker that runs its task.
        os.kill(os.getppid(), signal.SIGKILL)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return x * y + x


def get_inputs():
    return [torch.randn(N), torch.randn(N)]


def get_init_inputs():
    return []
'''


def test_a_ray_worker_killed_mid_task_is_retried_and_nothing_is_lost(cluster, tmp_path):
    marker = tmp_path / "killed-once"
    problem = tmp_path / "problem.py"
    problem.write_text(KILLER_PROBLEM.format(marker=str(marker)))
    names = ["good_pointwise", "bad_missing_tail", "good_pointwise", "bad_small_error"]
    with RayEvaluator(UNTIMED) as remote:
        verdicts = remote.evaluate_many(items(names, problem))
        assert remote.retries == 1
    assert marker.exists()
    assert [v.reason_code for v in verdicts] == [
        Reason.NOT_TIMED, Reason.UNWRITTEN_OUTPUT, Reason.NOT_TIMED, Reason.WRONG_VALUES]


class SourceTimed:
    """Real untimed verdicts, each correct kernel timed as a function of its source, faster
    than PyTorch so that it is accepted. Each item submitted is judged before `submit` returns,
    so that the verdicts land in the order the run sent them on either executor."""

    slots = 1

    def __init__(self, inner: Evaluator | RayEvaluator) -> None:
        self.inner = inner

    def __enter__(self) -> SourceTimed:
        return self

    def __exit__(self, *exc: object) -> None:
        self.inner.close()

    def evaluate(self, problem_path, source: str) -> Verdict:
        return self.evaluate_many([(problem_path, source)])[0]

    def evaluate_many(self, batch: list[tuple[Path, str]], counters: bool | list[bool] = False,
                      race_ms: float | None = None) -> list[Verdict]:
        verdicts = self.inner.evaluate_many(batch, counters, race_ms)
        for (_, source), verdict in zip(batch, verdicts, strict=True):
            if verdict.correct:
                digest = int(hashlib.sha256(source.encode()).hexdigest()[:8], 16)
                verdict.latency_ms, verdict.baseline_ms = 0.5 + digest / 2**32, 1.0
                verdict.speedup = verdict.baseline_ms / verdict.latency_ms
                verdict.accepted, verdict.reason_code, verdict.reason = True, Reason.ACCEPTED, ""
        return verdicts

    def submit(self, batch: list[tuple[Path, str]], counters: bool | list[bool] = False,
               race_ms: float | None = None) -> list[Future[Verdict]]:
        futures = []
        for verdict in self.evaluate_many(batch, counters, race_ms):
            futures.append(Future())
            futures[-1].set_result(verdict)
        return futures


def stored_tree(db: Path) -> list[tuple]:
    return sqlite3.connect(db).execute(
        "SELECT c.id, c.parent_id, c.source, v.accepted, v.reason_code FROM candidates c "
        "JOIN verdicts v ON v.id = c.verdict_id ORDER BY c.id").fetchall()


def test_the_optimize_run_grows_the_same_tree_on_ray_as_with_one_local_worker(
        cluster, tmp_path, monkeypatch, capsys):
    build = OptimizeRun._evaluator
    monkeypatch.setattr(OptimizeRun, "_evaluator",
                        lambda run, config: SourceTimed(build(run, replace(config, time=False))))
    trees = {}
    for executor, extra in [("local", ["--workers", "1"]), ("ray", [])]:
        db = tmp_path / f"{executor}.db"
        code = optimize_main([str(PROBLEM), "--device", "cpu", "--json", "--db", str(db),
                              "--out", str(tmp_path / executor), "--max-candidates", "10",
                              "--warmup", "0", "--trials", "2", "--no-site-compile", "--no-e2e",
                              "--executor", executor, *extra])
        assert code == 0
        report = json.loads(capsys.readouterr().out)
        assert report["searched"][0]["evaluations"] == 10
        trees[executor] = stored_tree(db)
    local, remote = trees["local"], trees["ray"]
    assert len(local) == 10 and max(row[1] or 0 for row in local) > 0, "no refinement"
    assert any(row[3] for row in local)
    assert remote == local
