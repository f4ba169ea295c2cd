"""A pool of worker processes kept busy with candidates: each a future, or a batch in input order.

Workers start when first needed (a candidate rejected by the static rules needs none). Each
pool thread owns one worker and pulls the next candidate as soon as its worker is free, so
one candidate compiles while another is timed. A worker that crashed, timed out or declared
itself unfit is replaced before its thread takes the next candidate.

On CUDA the workers are spread over the GPUs round robin: worker `i` of `n` runs on GPU `gpus[i %
len(gpus)]`, pinned to it by `CUDA_VISIBLE_DEVICES` in its environment (so inside the worker it is
`cuda:0`). `gpus` is `EvalConfig.gpus`, else every GPU torch sees. Five workers on two GPUs put
three on the first and two on the second; one worker on two GPUs uses only the first. Timing takes
turns through one file lock per GPU of the machine, shared with every other Kiln process
(`core.timing.model_timing.device_lock_path`), so concurrent work, of this run or another, never
inflates a measurement while different GPUs time in parallel. On the CPU there is one lock and no
pinning. Results go back to the caller, which alone writes the store.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import queue
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future
from contextlib import AbstractContextManager
from pathlib import Path

import torch

from core.evaluate.config import EvalConfig
from core.evaluate.memory import (
    WORKER_OVERHEAD_BYTES,
    DeviceLedger,
    MemoryBudget,
    ProblemBytes,
    problem_bytes,
)
from core.evaluate.verdict import Reason, Verdict
from core.evaluate.worker import Request, Worker, WorkerError
from core.runtime.errors import KilnInputError
from core.timing.device_lock import device_lock_path, physical_gpu

# A candidate's judging, given a function that evaluates a request on a free worker.
Job = Callable[[Callable[[Request], Verdict]], Verdict]


def pool_gpus(config: EvalConfig, device_count: Callable[[], int] = torch.cuda.device_count
              ) -> list[int]:
    """The GPUs (torch indices in this process) workers are spread over; none on the CPU."""
    if config.device == "cpu":
        return []
    count = device_count()
    if config.gpus is None:
        return list(range(count))
    missing = [gpu for gpu in config.gpus if not 0 <= gpu < count]
    if missing:
        raise KilnInputError(
            f"--gpus names GPU {missing[0]}, but this process sees {count} GPU(s)"
            + (f" (0 to {count - 1})" if count else ""),
            "pass indices as torch.cuda.device_count() counts them, e.g. --gpus 0,1")
    return list(config.gpus)


def pinning_env(gpu: int, environ: Mapping[str, str] = os.environ) -> dict[str, str]:
    """The environment that pins a worker to torch's GPU `gpu` of this process."""
    return {"CUDA_VISIBLE_DEVICES": physical_gpu(gpu, environ)}


def slot_gpus(workers: int, gpus: Sequence[int]) -> list[int | None]:
    """The GPU of each worker slot, round robin; None for every slot on the CPU."""
    if not gpus:
        return [None] * workers
    return [gpus[slot % len(gpus)] for slot in range(workers)]


def problem_key(problem_path: str) -> tuple[str, int]:
    """A problem file as it is now: a rewritten file is another problem."""
    return problem_path, Path(problem_path).stat().st_mtime_ns


class WorkerPool:
    def __init__(self, config: EvalConfig, workers: int = 1,
                 device_count: Callable[[], int] = torch.cuda.device_count) -> None:
        if workers < 1:
            raise ValueError("a pool needs at least one worker")
        self.config = config
        self.size = workers
        self.gpus = pool_gpus(config, device_count)
        self.slot_gpu = slot_gpus(workers, self.gpus)
        self.workers: list[Worker | None] = [None] * workers
        self.replacements = 0
        self.guard = threading.Lock()
        self.budget: MemoryBudget | None = None
        self.ledgers: dict[int, DeviceLedger] = {}
        self.held = contextlib.ExitStack()  # this process's own holdings, for the pool's life
        self.sizes: dict[tuple[str, int], ProblemBytes] = {}
        # The largest peak a verdict of each problem reported (the judge's and its candidate's
        # process's): later candidates of it hold that much when it is more than the estimate.
        self.measured: dict[tuple[str, int], int] = {}
        # Jobs waiting for a free worker, and the slots' threads taking them (`submit`).
        self.pending: queue.SimpleQueue[tuple[Job, Future[Verdict]] | None] = queue.SimpleQueue()
        self.slot_threads: list[threading.Thread] = []
        self.stopping = threading.Event()

    def lock_path(self, slot: int) -> str:
        """The timing lock of the slot's device: one per GPU of the machine, one for the CPU."""
        gpu = self.slot_gpu[slot]
        return device_lock_path(self.config.device,
                                None if gpu is None else physical_gpu(gpu))

    def worker_env(self, slot: int) -> dict[str, str]:
        gpu = self.slot_gpu[slot]
        return {} if gpu is None else pinning_env(gpu)

    def new_worker(self, slot: int) -> Worker:
        return Worker(self.config.device, self.config.startup_timeout_s, self.worker_env(slot))

    def run_on(self, slot: int, request: Request) -> Verdict:
        """The verdict of `request` on the slot's worker. The evaluator's own failure (a worker
        that failed in Kiln's code, inputs a candidate's process could not map) is judged again
        once, on a fresh worker, before it stands as the candidate's verdict; a judge or a
        candidate that ran out of device memory is judged again alone on its GPU, with no other
        candidate or run's step beside it: the device may have been full of what other processes
        held, which says nothing of the candidate."""
        alone = False
        try:
            verdict = self.run_once(slot, request)
            out_of_memory = (Reason.JUDGE_OUT_OF_MEMORY, *(
                [Reason.OUT_OF_MEMORY] if self.config.device == "cuda" else []))
            if verdict.reason_code not in (Reason.JUDGE_ERROR, *out_of_memory):
                return verdict
            alone = verdict.reason_code in out_of_memory
        except WorkerError:
            pass
        self.retire(slot)
        return self.run_once(slot, request, alone)

    def run_once(self, slot: int, request: Request, alone: bool = False) -> Verdict:
        phases: dict[str, float] = {}
        began = time.monotonic()
        worker = self.workers[slot]
        if worker is None or not worker.alive:
            if worker is not None:
                worker.close()
                with self.guard:
                    self.replacements += 1
            worker = self.workers[slot] = self.new_worker(slot)
            phases["worker start"] = time.monotonic() - began
        config = EvalConfig.from_dict(request.config)
        request = dataclasses.replace(
            request, config={**request.config,
                             "gpu_lock": config.gpu_lock or self.lock_path(slot)})
        waited = time.monotonic()
        with self.reserved(slot, request.problem_path, alone):
            phases["waiting for memory"] = time.monotonic() - waited
            verdict = worker.evaluate(request, config.compile_timeout_s, config.run_timeout_s)
        if verdict.peak_memory_bytes:
            key = problem_key(request.problem_path)
            with self.guard:
                self.measured[key] = max(self.measured.get(key, 0), verdict.peak_memory_bytes)
        verdict.phase_seconds = {**phases, **verdict.phase_seconds}
        return verdict

    def reserved(self, slot: int, problem_path: str, alone: bool = False
                 ) -> AbstractContextManager[None]:
        """Hold what judging the problem takes of the slot's GPU (`core.evaluate.memory`, or
        the most a verdict of it measured when that is more), in the run's budget and in the
        machine's ledger; `alone`: the whole GPU, once no other candidate or step holds any of
        it. Nothing to hold on the CPU."""
        gpu = self.slot_gpu[slot]
        if gpu is None:
            return contextlib.nullcontext()
        key = problem_key(problem_path)
        with self.guard:
            if self.budget is None:
                self.open_ledgers()
            if key not in self.sizes:
                self.sizes[key] = problem_bytes(problem_path)
            needed = max(self.sizes[key].needed, self.measured.get(key, 0))
        assert self.budget is not None
        ledger = self.ledgers[gpu]
        stack = contextlib.ExitStack()
        stack.enter_context(self.budget.reserve(gpu, self.budget.limits[gpu] if alone
                                                else needed))
        stack.enter_context(ledger.hold("candidate", ledger.capacity if alone else needed))
        return stack

    def open_ledgers(self) -> None:
        """The run's budget, and each GPU's ledger holding what this process and its workers
        keep there for the pool's life: the process's own tensors (a run's model) and a CUDA
        context each."""
        workers = {g: self.slot_gpu.count(g) for g in self.gpus}
        self.budget = MemoryBudget.of_free_memory(self.gpus, workers, self.config.memory_bytes)
        for gpu in self.gpus:
            ledger = self.ledgers[gpu] = DeviceLedger.of_gpu(gpu)
            kept = torch.cuda.memory_reserved(gpu) + (workers[gpu] + 1) * WORKER_OVERHEAD_BYTES
            self.held.enter_context(ledger.hold("process", kept))

    def submit(self, job: Job) -> Future[Verdict]:
        """Queue `job`: the next free worker runs it with a function that evaluates a request on
        that worker. A failure of Kiln's own judging is the candidate's verdict; any other
        exception is the future's."""
        future: Future[Verdict] = Future()
        with self.guard:
            if not self.slot_threads:
                self.slot_threads = [threading.Thread(target=self._drain, args=(slot,),
                                                      name=f"kiln-pool-{slot}", daemon=True)
                                     for slot in range(self.size)]
                for thread in self.slot_threads:
                    thread.start()
        self.pending.put((job, future))
        return future

    def _drain(self, slot: int) -> None:
        """The slot's thread: the next queued job, as soon as its worker is free."""
        while (item := self.pending.get()) is not None:
            job, future = item
            if self.stopping.is_set() or not future.set_running_or_notify_cancel():
                future.cancel()
                continue
            began = time.monotonic()
            try:
                verdict = job(lambda request: self.run_on(slot, request))
            except WorkerError as err:
                self.retire(slot)
                verdict = Verdict.rejected(Reason.JUDGE_ERROR,
                                           f"the evaluator failed judging it: {err}")
            except BaseException as err:  # the caller's to handle, through the future
                future.set_exception(err)
                continue
            verdict.eval_seconds = time.monotonic() - began
            future.set_result(verdict)

    def map(self, jobs: Sequence[Job]) -> list[Verdict]:
        """Each job's verdict, in order, every worker kept busy (`submit`)."""
        futures = [self.submit(job) for job in jobs]
        try:
            return [future.result() for future in futures]
        except KeyboardInterrupt:
            self.stop_now(futures)
            raise

    def stop_now(self, futures: Sequence[Future[Verdict]]) -> None:
        """Ctrl-C: none of `futures` still queued starts, and the busy workers are killed, so
        that the interrupt ends at once."""
        self.stopping.set()
        for future in futures:
            future.cancel()
        # Kill until every job is back: a worker still starting joins the pool later.
        while not all(future.done() for future in futures):
            for slot in range(self.size):
                self.retire(slot)
            time.sleep(0.1)
        self.stopping.clear()

    def retire(self, slot: int) -> None:
        """Drop the slot's worker after a failure of Kiln's own; the next job starts another."""
        worker = self.workers[slot]
        if worker is not None:
            worker.kill()

    def close(self) -> None:
        self.stopping.set()  # what is still queued never starts
        for _ in self.slot_threads:
            self.pending.put(None)
        for thread in self.slot_threads:
            thread.join()
        for worker in self.workers:
            if worker is not None:
                worker.close()
        self.held.close()
