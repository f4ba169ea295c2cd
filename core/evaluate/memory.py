"""Device memory shared out candidate by candidate, within a run and between runs.

Judging a candidate takes at most three times its problem's input and output bytes
(`core.evaluate.trial` says why), so before a worker takes a candidate it reserves that much,
twice over:
- of its run's budget on that GPU (`MemoryBudget`): `EvalConfig.memory_bytes` (`--memory-gb`),
  by default what the GPU had free when the run's first candidate came;
- of the GPU itself (`DeviceLedger`): a file every Kiln process of the machine shares, which
  also holds what each run's own process keeps on the GPU (its model, for one) and each
  worker's CUDA context, so that runs side by side never ask for more than the GPU has.
It waits while either is too full. A problem larger than the whole budget is judged when nothing
else is reserved: fewer candidates at once, not a failure. A run's own steps on the GPU
(profiling, the sites' baselines, the end-to-end check) wait in the same ledger
(`device_step`), so that runs side by side take turns there too; one that has waited PATIENCE_S
is passed by no later one, however small.
"""

from __future__ import annotations

import contextlib
import fcntl
import itertools
import json
import os
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import torch

from core.evaluate.config import EvalConfig
from core.evaluate.correctness import flatten
from core.evaluate.sandbox import Limits
from core.runtime.problem_loader import load_problem
from core.timing.device_lock import lock_folder, physical_gpu

# What judging needs, in multiples of the problem's input and output bytes.
JUDGE_FACTOR = 3
# How long a holding waits in the ledger before later ones, which would fit, queue behind it: a
# run's 17 GB profiling step waited 190 s while other runs' candidates came and went
# (bench/NOTES.md, 2026-12-06, 02:40-03:02 UTC).
PATIENCE_S = 20.0
# Numbers the holdings of this process, of every ledger in it (a run's pool and its own steps
# each open one of the same GPU).
_NUMBERS = itertools.count(1)
# A worker's CUDA contexts (the judge's and its candidate's process's), their allocators' pools
# and the kernels' modules, held whatever it judges.
WORKER_OVERHEAD_BYTES = 2 << 30
# What a candidate's process may take beyond its inputs and outputs: Triton's compiler, CUDA's
# libraries, the candidate's own scratch.
CANDIDATE_HOST_BYTES = 4 << 30
CANDIDATE_DEVICE_BYTES = 1 << 30


@dataclass(frozen=True)
class ProblemBytes:
    inputs: int
    outputs: int

    @property
    def needed(self) -> int:
        return JUDGE_FACTOR * (self.inputs + self.outputs)


def _tensor_bytes(values: object) -> int:
    return sum(t.numel() * t.element_size() for t in flatten(values)
               if isinstance(t, torch.Tensor))


def problem_bytes(path: str | Path, seed: int = 0) -> ProblemBytes:
    """The bytes of a problem's inputs and of its reference's outputs, found on the meta device:
    shapes only, nothing allocated. Where the reference cannot run on meta tensors, its
    outputs are taken to be as large as its inputs."""
    problem = load_problem(Path(path), captured=False)
    inputs = problem.inputs(seed, "meta")
    in_bytes = _tensor_bytes(inputs)
    try:
        with torch.device("meta"), torch.no_grad():
            outputs = problem.model_class(*problem.init_inputs())(*inputs)
        out_bytes = _tensor_bytes(outputs)
    except Exception:  # an op without a meta kernel: the estimate falls back, nothing is lost
        out_bytes = in_bytes
    return ProblemBytes(in_bytes, out_bytes)


def candidate_limits(config: EvalConfig, sizes: ProblemBytes) -> Limits:
    """The CPU seconds and memory of a candidate's process: its share of what judging the
    problem takes, and room for its compiler; `EvalConfig.candidate_memory_bytes` when set."""
    host = config.candidate_memory_bytes or CANDIDATE_HOST_BYTES + 2 * sizes.needed
    device = (config.candidate_memory_bytes or CANDIDATE_DEVICE_BYTES + sizes.needed
              if config.device == "cuda" else None)
    return Limits(config.cpu_limit_s, host, device)


class MemoryBudget:
    """Bytes reserved per GPU, each reservation held while one candidate is judged."""

    def __init__(self, limits: dict[int, int]) -> None:
        self.limits = dict(limits)
        self.held = dict.fromkeys(limits, 0)
        self.changed = threading.Condition()

    @staticmethod
    def of_free_memory(gpus: list[int], workers_per_gpu: dict[int, int],
                       limit_bytes: int | None) -> MemoryBudget:
        """`limit_bytes` per GPU, or what each GPU has free now less its workers' contexts."""
        limits = {}
        for gpu in gpus:
            if limit_bytes is not None:
                limits[gpu] = limit_bytes
            else:
                free, _ = torch.cuda.mem_get_info(gpu)
                limits[gpu] = max(0, free - workers_per_gpu.get(gpu, 0) * WORKER_OVERHEAD_BYTES)
        return MemoryBudget(limits)

    @contextlib.contextmanager
    def reserve(self, gpu: int, needed: int) -> Iterator[None]:
        """Hold `needed` bytes of `gpu`'s budget; wait until they fit, or until the GPU is free
        of other reservations when they never will."""
        with self.changed:
            self.changed.wait_for(lambda: self.held[gpu] == 0
                                  or self.held[gpu] + needed <= self.limits[gpu])
            self.held[gpu] += needed
        try:
            yield
        finally:
            with self.changed:
                self.held[gpu] -= needed
                self.changed.notify_all()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@dataclass
class LedgerState:
    held: dict[str, int]  # holder -> bytes
    waiting: dict[str, float]  # waiter -> since when (time.time())


class DeviceLedger:
    """Bytes of one GPU held by Kiln's processes, one entry per holding, in a JSON file under
    the machine's device-lock folder. An entry is `pid:name`; entries of dead processes are
    dropped whenever the file is read, so a killed run frees what it held."""

    def __init__(self, gpu: str, capacity: int, poll_s: float = 0.2,
                 patience_s: float = PATIENCE_S,
                 free_bytes: Callable[[], int] | None = None) -> None:
        self.path = lock_folder() / f"gpu-{gpu}.memory"
        self.capacity = capacity
        self.poll_s = poll_s
        self.patience_s = patience_s
        self.free_bytes = free_bytes

    @classmethod
    def of_gpu(cls, gpu: int) -> DeviceLedger:
        """The ledger of this process's GPU `gpu`, as large as the GPU, reading what the GPU has
        free."""
        _, total = torch.cuda.mem_get_info(gpu)
        return cls(physical_gpu(gpu), total, free_bytes=lambda: torch.cuda.mem_get_info(gpu)[0])

    def device_has_room(self, needed: int) -> bool:
        """Whether the GPU itself has `needed` bytes free: what the ledger does not know of
        (another program's memory, a process keeping more than it declared) is there too."""
        return self.free_bytes is None or needed <= self.free_bytes()

    def entries(self) -> dict[str, int]:
        """Who holds what now."""
        with self._locked() as handle:
            return self._read(handle).held

    @contextlib.contextmanager
    def _locked(self) -> Iterator[IO[str]]:
        with self.path.open("a+") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            yield handle

    @staticmethod
    def _read(handle: IO[str]) -> LedgerState:
        handle.seek(0)
        text = handle.read()
        data = json.loads(text) if text.strip() else {}
        if "held" not in data:  # a ledger written before waiters were kept: holdings only
            data = {"held": data, "waiting": {}}

        def live(entries: dict[str, Any]) -> dict[str, Any]:
            return {k: v for k, v in entries.items() if _alive(int(k.split(":")[0]))}

        return LedgerState(live(data["held"]), live(data.get("waiting", {})))

    @staticmethod
    def _write(handle: IO[str], state: LedgerState) -> None:
        handle.seek(0)
        handle.truncate()
        handle.write(json.dumps({"held": state.held, "waiting": state.waiting}))
        handle.flush()

    @contextlib.contextmanager
    def hold(self, kind: str, needed: int) -> Iterator[None]:
        """Hold `needed` bytes. A "candidate" (or a run's own "step") first waits until they
        fit beside every other holding (a candidate: and in what the GPU has free), or until no
        other candidate or step is held anywhere (then it goes however large); a "process"
        holding (what a process keeps on the GPU whatever it does) is taken at once. A holding
        that came after one that has waited `patience_s` waits behind it, even where it would
        fit: small candidates arriving one after another never keep a large step (a run's
        profiling, say) out for good."""
        number = next(_NUMBERS)
        key, waiter = f"{os.getpid()}:{kind}:{number}", f"{os.getpid()}:waiting:{number}"
        since = time.time()
        try:
            while True:
                with self._locked() as handle:
                    state = self._read(handle)
                    fits = (sum(state.held.values()) + needed <= self.capacity
                            and (kind != "candidate" or self.device_has_room(needed)))
                    alone = all(":process:" in k for k in state.held)
                    now = time.time()
                    behind = any(other != waiter and began < since
                                 and now - began > self.patience_s
                                 for other, began in state.waiting.items())
                    if kind == "process" or ((fits or alone) and not behind):
                        state.waiting.pop(waiter, None)
                        state.held[key] = needed
                        self._write(handle, state)
                        break
                    state.waiting[waiter] = since
                    self._write(handle, state)
                time.sleep(self.poll_s)
        except BaseException:
            self._drop(waiter)
            raise
        try:
            yield
        finally:
            self._drop(key)

    def _drop(self, key: str) -> None:
        with self._locked() as handle:
            state = self._read(handle)
            state.held.pop(key, None)
            state.waiting.pop(key, None)
            self._write(handle, state)


def model_bytes(spec: str) -> int:
    """The input and output bytes of a model given as a problem file (shapes only, on the meta
    device); 0 for another spec or a file whose shapes cannot be found that way."""
    path = Path(spec)
    if path.suffix != ".py" or not path.is_file():
        return 0
    try:
        size = problem_bytes(path)
    except Exception:  # not a problem file meta tensors can run: no estimate, nothing lost
        return 0
    return size.inputs + size.outputs


@contextlib.contextmanager
def device_step(device: torch.device | str, needed: int) -> Iterator[None]:
    """One of a run's own steps on the GPU (profiling, timing a site's baselines, the
    end-to-end check), held in the machine's ledger as a candidate is: it waits until `needed`
    bytes, and what its process holds of the GPU already, fit beside what other runs hold, and
    gives its process's cached blocks back after, so that what it used is free for them."""
    if not str(device).startswith("cuda") or not torch.cuda.is_available():
        yield  # nothing to share out (a device that is not a GPU is refused by the step itself)
        return
    gpu = torch.cuda.current_device()
    held = torch.cuda.memory_reserved(gpu)
    with DeviceLedger.of_gpu(gpu).hold("step", needed + held):
        try:
            yield
        finally:
            torch.cuda.empty_cache()
