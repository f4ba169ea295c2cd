"""Evaluation on a Ray cluster: each candidate is a Ray task on one GPU of any host.

    with RayEvaluator(EvalConfig(), address="auto") as ev:
        verdicts = ev.evaluate_many([(problem_path, source), ...])

The same interface as `core.evaluate.Evaluator`, and the same judging: the static rules run
here on the driver, and a task judges what passes them through `core.evaluate.worker.Worker`, the
subprocess the local pool uses, with its compile and run time limits and its crash handling.
So a candidate that crashes or hangs gets the same verdict on Ray as locally, and only a Ray
worker that dies itself (its host lost, the process killed) makes the driver resubmit the task,
up to `max_retries` times. Each task asks for one GPU (`num_gpus=1`; on the CPU, one core) and
Ray pins it there through CUDA_VISIBLE_DEVICES; a Ray worker keeps its judge process warm for
the next task. Problem files (and their captured inputs) travel with the task through Ray's
object store, so hosts need no shared file system; Kiln's `core` package reaches them as a
runtime_env module (`job_runtime_env()`, passed to `ray.init` here, or by a caller that starts
Ray itself). Verdicts come back in input order; the search and the store stay here.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
import threading
import time
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from types import ModuleType
from typing import Any

import core
from core.evaluate.config import EvalConfig
from core.evaluate.evaluator import counter_flags, item_configs, screen
from core.evaluate.verdict import Reason, Verdict
from core.evaluate.worker import Request, Worker
from core.runtime.errors import KilnInputError
from core.runtime.problem_loader import CAPTURED_INPUTS_FILE

INSTALL_HINT = "pip install 'kiln[ray]'"
# Beyond the judge's own limits, time for a task to reach a Ray worker and start its judge.
SCHEDULING_SLACK_S = 60.0


def import_ray() -> ModuleType:
    try:
        import ray
    except ImportError as err:
        raise KilnInputError("--executor ray needs Ray, which is not installed",
                             f"{INSTALL_HINT}, or drop --executor ray") from err
    return ray


def job_runtime_env() -> dict[str, Any]:
    """What a driver passes to `ray.init` so that Ray workers on any host can import Kiln."""
    return {"py_modules": [str(Path(core.__file__).parent)], "excludes": ["__pycache__"]}


def problem_files(problem_path: Path) -> dict[str, bytes]:
    """The problem file and, when saved beside it, its captured inputs."""
    files = {problem_path.name: problem_path.read_bytes()}
    captured = problem_path.parent / CAPTURED_INPUTS_FILE
    if captured.exists():
        files[CAPTURED_INPUTS_FILE] = captured.read_bytes()
    return files


def materialize(files: dict[str, bytes], problem_name: str) -> Path:
    """Write a shipped problem into a folder named by its contents; returns the problem path."""
    digest = hashlib.sha256()
    for name in sorted(files):
        digest.update(name.encode() + b"\0" + files[name])
    folder = Path(tempfile.gettempdir()) / "kiln-ray-problems" / digest.hexdigest()[:24]
    folder.mkdir(parents=True, exist_ok=True)
    for name, data in files.items():
        target = folder / name
        if not target.exists():
            # Several tasks on one host may write the same problem: each writes its own file
            # and renames it into place, so no reader sees half a file.
            partial = folder / f".{name}.{os.getpid()}"
            partial.write_bytes(data)
            os.replace(partial, target)
    return folder / problem_name


_warm: dict[str, Worker] = {}


def warm_worker(device: str, startup_timeout_s: float) -> tuple[Worker, bool]:
    """This Ray worker's judge process for the GPU Ray gave the task, and whether a dead one
    had to be replaced. A judge started for another GPU is closed first."""
    key = f"{device}:{os.environ.get('CUDA_VISIBLE_DEVICES', '')}"
    worker = _warm.get(key)
    if worker is not None and worker.alive:
        return worker, False
    replaced = worker is not None
    for stale in _warm.values():
        stale.close()
    _warm.clear()
    _warm[key] = Worker(device, startup_timeout_s)
    return _warm[key], replaced


def judge_task(request: dict[str, Any], files: dict[str, bytes]) -> dict[str, Any]:
    """Runs on a Ray worker: judge one screened request; the verdict as a dict."""
    problem_name = Path(request["problem_path"]).name
    request = {**request, "problem_path": str(materialize(files, problem_name))}
    config = EvalConfig.from_dict(request["config"])
    worker, replaced = warm_worker(config.device, config.startup_timeout_s)
    try:
        verdict = worker.evaluate(Request(**request), config.compile_timeout_s,
                                  config.run_timeout_s)
    except KilnInputError as err:  # its two fields do not survive Ray's exception pickling
        return {"input_error": [err.problem, err.fix], "replaced": replaced}
    return {"verdict": verdict.to_dict(), "replaced": replaced}


class RayEvaluator:
    """Judges candidates as Ray tasks, as many at a time as the cluster has GPUs (or CPUs)."""

    def __init__(self, config: EvalConfig, address: str | None = None,
                 max_retries: int = 3) -> None:
        self.ray = import_ray()
        self.config = config
        if config.gpus is not None:
            raise KilnInputError("--gpus picks GPUs of this machine; on Ray the cluster assigns "
                                 "them", "drop --gpus, or use --executor local")
        self.max_retries = max_retries
        self.started_ray = not self.ray.is_initialized()
        if self.started_ray:
            self.ray.init(address=address, include_dashboard=False,
                          runtime_env=job_runtime_env())
        resource = "GPU" if config.device == "cuda" else "CPU"
        self.slots = int(self.ray.cluster_resources().get(resource, 0))
        if self.slots < 1:
            self.close()
            raise KilnInputError(f"the Ray cluster at {address or 'this machine'} has no "
                                 f"{resource} for --device {config.device}",
                                 "add GPU nodes to the cluster, or pass --device cpu")
        env_vars = {"TRITON_INTERPRET": "1"} if config.device == "cpu" else {}
        self.task = self.ray.remote(
            num_gpus=1 if config.device == "cuda" else 0, num_cpus=1,
            # Resubmitted by the driver (see evaluate_many), which counts each retry.
            max_retries=0,
            # Keep the Ray worker, and with it the warm judge, for the next task: the judge
            # runs the candidate in its own process, so the GPU memory Ray's default of one
            # call per GPU worker would release is the judge's to manage.
            max_calls=0,
            runtime_env={"env_vars": env_vars},
        )(judge_task)
        self.retries = 0
        self.judges_replaced = 0
        self.shipped: dict[Path, tuple[int, Any]] = {}
        self.guard = threading.Lock()  # the counts and `shipped`, shared by `submit`'s threads
        self.waiting = ThreadPoolExecutor(self.slots, thread_name_prefix="kiln-ray")

    def __enter__(self) -> RayEvaluator:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.waiting.shutdown(wait=False, cancel_futures=True)
        if self.started_ray and self.ray.is_initialized():
            self.ray.shutdown()

    @property
    def replacements(self) -> int:
        """Judge processes restarted after a crash, plus tasks resubmitted after their Ray
        worker died."""
        return self.judges_replaced + self.retries

    def deadline_s(self, config: EvalConfig) -> float:
        return (config.startup_timeout_s + config.compile_timeout_s + config.run_timeout_s
                + SCHEDULING_SLACK_S)

    def files_ref(self, problem_path: Path) -> Any:
        """The problem's files in the object store, put there once per version of the file."""
        stamp = problem_path.stat().st_mtime_ns
        with self.guard:
            cached = self.shipped.get(problem_path)
            if cached is None or cached[0] != stamp:
                cached = self.shipped[problem_path] = (
                    stamp, self.ray.put(problem_files(problem_path)))
        return cached[1]

    def submit(self, items: Sequence[tuple[str | Path, str]],
               counters: bool | Sequence[bool] = False,
               race_ms: float | None = None) -> list[Future[Verdict]]:
        """`evaluate_many` without waiting: a future a verdict, each item a task of its own,
        at most one a GPU of the cluster at once."""
        return [self.waiting.submit(lambda item=item, flag=flag:
                                    self.evaluate_many([item], [flag], race_ms)[0])
                for item, flag in zip(items, counter_flags(len(items), counters), strict=True)]

    def stop_now(self, futures: Sequence[Future[Verdict]]) -> None:
        """Ctrl-C while `futures` are pending: none still queued starts (the tasks in flight
        end with the cluster's connection, when the evaluator closes)."""
        for future in futures:
            future.cancel()

    def evaluate(self, problem_path: str | Path, candidate_source: str) -> Verdict:
        return self.evaluate_many([(problem_path, candidate_source)])[0]

    def evaluate_many(self, items: Sequence[tuple[str | Path, str]],
                      counters: bool | Sequence[bool] = False,
                      race_ms: float | None = None) -> list[Verdict]:
        """Verdicts in the order of `items`; at most one task per GPU in flight, so a task's
        deadline counts from when it can start. `counters`: with hardware counters, for each
        item or for those whose flag is set; `race_ms` as `Evaluator.evaluate_many`'s."""
        ray = self.ray
        configs = item_configs(self.config, len(items), counters, race_ms)
        deadlines = [self.deadline_s(c) for c in configs]  # a counters read takes longer
        results: list[Verdict | None] = [None] * len(items)
        requests: dict[int, Request] = {}
        for index, ((path, source), config) in enumerate(zip(items, configs, strict=True)):
            began = time.monotonic()
            screened = screen(path, source, config)
            if isinstance(screened, Verdict):
                screened.eval_seconds = time.monotonic() - began
                results[index] = screened
            else:
                requests[index] = screened
        waiting = list(requests)
        attempts = dict.fromkeys(requests, 0)
        running: dict[Any, tuple[int, float]] = {}  # task ref -> (item index, submitted at)
        while waiting or running:
            while waiting and len(running) < self.slots:
                index = waiting.pop(0)
                request = requests[index]
                attempts[index] += 1
                ref = self.task.remote(request.__dict__,
                                       self.files_ref(Path(request.problem_path)))
                running[ref] = (index, time.monotonic())
            due = min(running, key=lambda r: running[r][1] + deadlines[running[r][0]])
            next_deadline = running[due][1] + deadlines[running[due][0]]
            ready, _ = ray.wait(list(running), num_returns=1,
                                timeout=max(0.0, next_deadline - time.monotonic()))
            if not ready:
                index, submitted = running.pop(due)
                ray.cancel(due, force=True)
                results[index] = Verdict.rejected(
                    Reason.TIMEOUT, f"no verdict from the Ray cluster within "
                    f"{deadlines[index]:g}s; the task was cancelled", timed_out=True)
                results[index].eval_seconds = time.monotonic() - submitted
                continue
            ref = ready[0]
            index, submitted = running.pop(ref)
            try:
                outcome = ray.get(ref)
            except (ray.exceptions.WorkerCrashedError, ray.exceptions.NodeDiedError,
                    ray.exceptions.ObjectLostError) as err:
                if attempts[index] <= self.max_retries:
                    with self.guard:
                        self.retries += 1
                    waiting.insert(0, index)
                    continue
                results[index] = Verdict.rejected(
                    Reason.CRASH, f"the Ray worker died on each of {attempts[index]} attempts "
                    f"to judge it: {type(err).__name__}: {err}", crashed=True)
                results[index].eval_seconds = time.monotonic() - submitted
                continue
            except ray.exceptions.RayTaskError as err:
                if err.cause is not None:  # Kiln's own error in the task: the same as locally
                    raise err.cause from err
                raise
            with self.guard:
                self.judges_replaced += outcome["replaced"]
            if "input_error" in outcome:
                raise KilnInputError(*outcome["input_error"])
            verdict = Verdict.from_dict(outcome["verdict"])
            verdict.tier = requests[index].tier
            verdict.eval_seconds = time.monotonic() - submitted
            results[index] = verdict
        return [verdict for verdict in results if verdict is not None]
