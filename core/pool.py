"""A pool of worker processes kept busy with a batch of candidates, results in input order.

Workers start when first needed (a candidate rejected by the static rules needs none). Each
pool thread owns one worker and pulls the next candidate as soon as its worker is free, so
one candidate compiles while another is timed. Timing itself takes turns on the GPU through a
file lock, so concurrent work never inflates a measurement. A worker that crashed, timed out or
declared itself unfit is replaced before its thread takes the next candidate.
"""

from __future__ import annotations

import dataclasses
import queue
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from core.eval_config import EvalConfig
from core.verdict import Verdict
from core.worker import Request, Worker


class WorkerPool:
    def __init__(self, config: EvalConfig, workers: int = 1) -> None:
        if workers < 1:
            raise ValueError("a pool needs at least one worker")
        self.config = config
        self.folder = Path(tempfile.mkdtemp(prefix="kiln-pool-"))
        self.lock_path = str(self.folder / "device.lock")
        self.size = workers
        self.workers: list[Worker | None] = [None] * workers
        self.replacements = 0
        self.guard = threading.Lock()

    def new_worker(self) -> Worker:
        return Worker(self.config.device, self.config.startup_timeout_s)

    def request_config(self, config: dict) -> dict:
        return {**config, "gpu_lock": self.lock_path}

    def run_on(self, slot: int, request: Request) -> Verdict:
        worker = self.workers[slot]
        if worker is None or not worker.alive:
            if worker is not None:
                worker.close()
                with self.guard:
                    self.replacements += 1
            worker = self.workers[slot] = self.new_worker()
        config = EvalConfig.from_dict(request.config)
        request = dataclasses.replace(request, config=self.request_config(request.config))
        return worker.evaluate(request, config.compile_timeout_s, config.run_timeout_s)

    def map(self, jobs: Sequence[Callable[[Callable[[Request], Verdict]], Verdict]]
            ) -> list[Verdict]:
        """Run each job with a function that evaluates a request on a free worker."""
        pending: queue.Queue[int] = queue.Queue()
        for index in range(len(jobs)):
            pending.put(index)
        results: list[Verdict | None] = [None] * len(jobs)

        def drain(slot: int) -> None:
            while True:
                try:
                    index = pending.get_nowait()
                except queue.Empty:
                    return
                began = time.monotonic()
                verdict = jobs[index](lambda request: self.run_on(slot, request))
                verdict.eval_seconds = time.monotonic() - began
                results[index] = verdict

        with ThreadPoolExecutor(self.size) as threads:
            for future in [threads.submit(drain, slot) for slot in range(self.size)]:
                future.result()
        return [verdict for verdict in results if verdict is not None]

    def close(self) -> None:
        for worker in self.workers:
            if worker is not None:
                worker.close()
        shutil.rmtree(self.folder, ignore_errors=True)
