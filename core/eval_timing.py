"""Time a reference or candidate model by the evaluator's rules, on top of `core.timing`.

Before every trial the device is synchronized (nothing left over from the last trial runs inside
this one), the L2 cache is flushed by reading a buffer twice its size, and the next of several
copies of the inputs is selected, so no trial finds its operands already cached. Reference and
candidate are timed by the same code in the same process.
"""

from __future__ import annotations

import fcntl
import math
import os
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import IO

import torch

from core.timing import TimingStats, synchronize, time_callable

# The flush buffer is twice the L2 size: H200's L2 is 60 MiB, so 120 MiB.
FLUSH_FACTOR = 2


def input_bytes(inputs: list[object]) -> int:
    return sum(t.numel() * t.element_size() for t in inputs if isinstance(t, torch.Tensor))


def l2_size(device: torch.device) -> int:
    if device.type != "cuda":
        return 0
    return int(torch.cuda.get_device_properties(device).L2_cache_size)


def rotation_copies(inputs: list[object], device: torch.device, budget_bytes: int) -> int:
    """How many input copies cover the L2 twice over, within `budget_bytes` of extra memory."""
    size = max(input_bytes(inputs), 1)
    wanted = math.ceil(FLUSH_FACTOR * l2_size(device) / size)
    return max(1, min(wanted, budget_bytes // size))


def make_flush(device: torch.device) -> Callable[[], None]:
    if device.type != "cuda":
        return lambda: None
    buffer = torch.zeros(FLUSH_FACTOR * l2_size(device) // 4, dtype=torch.int32, device=device)

    def flush() -> None:
        # Read, not write: a written flush leaves the L2 full of dirty lines whose write-back
        # then lands inside the timed call (a 64 MB pointwise kernel spread 34% across
        # evaluations on an H200 with a zero_() flush).
        torch.cuda.synchronize(device)
        buffer.sum()

    return flush


def clone_inputs(inputs: list[object]) -> list[object]:
    return [t.clone() if isinstance(t, torch.Tensor) else t for t in inputs]


def time_model(
    model: Callable[..., object],
    input_sets: list[list[object]],
    device: torch.device,
    warmup: int,
    trials: int,
    warmup_ms: float = 0.0,
) -> TimingStats:
    """Median latency of `model(*inputs)`, rotating through `input_sets`, L2 flushed each trial.

    Warm-up lasts `warmup` calls and at least `warmup_ms` of wall-clock time: an idle GPU runs
    at a fraction of its clock until it has been busy for a while, and a fixed handful of
    microsecond-scale calls does not get it there. Wall time, not a count derived from the
    kernel's own time: for a 10 µs kernel that count meant thousands of flushed calls, over a
    second per model, and the evaluation pool fell below 16 candidates a minute.
    """
    flush = make_flush(device)
    position = [0]

    def before_each() -> None:
        position[0] = (position[0] + 1) % len(input_sets)
        flush()

    def call() -> None:
        model(*input_sets[position[0]])

    with torch.no_grad():
        begin = time.perf_counter()
        while (time.perf_counter() - begin) * 1e3 < warmup_ms:
            before_each()
            call()
        stats = time_callable(call, device, warmup=warmup, trials=trials, before_each=before_each)
    synchronize(device)
    return stats


def physical_gpu(index: int, environ: Mapping[str, str] = os.environ) -> str:
    """The machine's name for torch's GPU `index` in a process with this environment: when the
    process sees a subset of the machine (CUDA_VISIBLE_DEVICES=2,3), its index 1 is GPU 3."""
    visible = environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None or not visible.strip():
        return str(index)
    return [name.strip() for name in visible.split(",") if name.strip()][index]


def device_lock_path(device: str, gpu: str | None = None) -> str:
    """The timing lock of one device of this machine, shared by every Kiln process of this user:
    two runs on one GPU take turns timing instead of inflating each other's measurements.
    `gpu`: the machine's name for the GPU (`physical_gpu`); by default this process's current
    one."""
    folder = Path(tempfile.gettempdir()) / f"kiln-device-locks-{os.getuid()}"
    folder.mkdir(exist_ok=True)
    if device == "cpu":
        return str(folder / "cpu.lock")
    name = gpu if gpu is not None else physical_gpu(torch.cuda.current_device())
    return str(folder / f"gpu-{name}.lock")


class DeviceLock:
    """Turns on one device between the processes of this machine: timing holds it alone,
    correctness runs share it. Many processes may run checks at once, but none while another
    times, so a measurement never overlaps anyone's kernels. A second file is the turnstile
    that a timer holds while it waits: checks that come later queue behind it instead of
    starving it.

    `path` None: no lock (a process alone on its device)."""

    def __init__(self, path: str | None) -> None:
        self.path = path
        self.handle: IO[str] | None = None
        self.mode = 0  # 0, fcntl.LOCK_SH or fcntl.LOCK_EX

    def _take(self, mode: int) -> None:
        """Drop what is held first, then queue at the turnstile: a process never waits while
        holding the lock, so no two can wait on each other."""
        assert self.path is not None
        if self.handle is None:
            self.handle = Path(self.path).open("a")  # noqa: SIM115 - held until _drop
        elif self.mode:
            fcntl.flock(self.handle, fcntl.LOCK_UN)
        with Path(self.path + ".turnstile").open("a") as turnstile:
            fcntl.flock(turnstile, fcntl.LOCK_EX)
            fcntl.flock(self.handle, mode)
        self.mode = mode

    def _drop(self) -> None:
        if self.handle is not None:
            fcntl.flock(self.handle, fcntl.LOCK_UN)
            self.handle.close()
            self.handle, self.mode = None, 0

    @contextmanager
    def hold(self, mode: int) -> Iterator[None]:
        """Hold the lock in `mode` (LOCK_SH or LOCK_EX); inside a hold of the other mode, the
        lock changes mode for the inner block and changes back after it."""
        if self.path is None or mode == self.mode:
            yield
            return
        before = self.mode
        self._take(mode)
        try:
            yield
        finally:
            if before:
                self._take(before)
            else:
                self._drop()

    @contextmanager
    def released(self) -> Iterator[None]:
        """Let go of the lock for the block (another process of this one's must take it), and
        take it back in the same mode after."""
        before = self.mode
        if before and self.handle is not None:
            fcntl.flock(self.handle, fcntl.LOCK_UN)
            self.mode = 0
        try:
            yield
        finally:
            if before:
                self._take(before)

    def shared(self) -> AbstractContextManager[None]:
        return self.hold(fcntl.LOCK_SH)

    def exclusive(self) -> AbstractContextManager[None]:
        return self.hold(fcntl.LOCK_EX)


def exclusive_device(lock_path: str | None) -> AbstractContextManager[None]:
    """Hold the device alone while timing (see `DeviceLock`)."""
    return DeviceLock(lock_path).exclusive()
