"""One process at a time times a device: a lock per device that every Kiln process shares.

Checks may share a GPU; a timing (and a hardware-counter read) holds it alone, so that two runs
on one GPU take turns measuring instead of inflating each other's figures.
"""

from __future__ import annotations

import fcntl
import os
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import IO

import torch


def physical_gpu(index: int, environ: Mapping[str, str] = os.environ) -> str:
    """The machine's name for torch's GPU `index` in a process with this environment: when the
    process sees a subset of the machine (CUDA_VISIBLE_DEVICES=2,3), its index 1 is GPU 3."""
    visible = environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None or not visible.strip():
        return str(index)
    return [name.strip() for name in visible.split(",") if name.strip()][index]


def lock_folder() -> Path:
    """Where every Kiln process of this user keeps its per-device files."""
    folder = Path(tempfile.gettempdir()) / f"kiln-device-locks-{os.getuid()}"
    folder.mkdir(exist_ok=True)
    return folder


def device_lock_path(device: str, gpu: str | None = None) -> str:
    """The timing lock of one device of this machine, shared by every Kiln process of this user:
    two runs on one GPU take turns timing instead of inflating each other's measurements.
    `gpu`: the machine's name for the GPU (`physical_gpu`); by default this process's current
    one."""
    folder = lock_folder()
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

    def __init__(self, path: str | None,
                 on_wait: Callable[[float], None] | None = None) -> None:
        """`on_wait`: told the seconds of each wait for the lock (another process's turn)."""
        self.path = path
        self.on_wait = on_wait
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
        began = time.perf_counter()
        with Path(self.path + ".turnstile").open("a") as turnstile:
            fcntl.flock(turnstile, fcntl.LOCK_EX)
            fcntl.flock(self.handle, mode)
        self.mode = mode
        if self.on_wait is not None:
            self.on_wait(time.perf_counter() - began)

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


_PROCESS_LOCKS: dict[str, DeviceLock] = {}


def process_lock(lock_path: str | None) -> DeviceLock:
    """This process's one `DeviceLock` of `lock_path`: a timing inside a shared hold of the same
    lock changes its mode instead of waiting on a second handle of this process's own."""
    if lock_path is None:
        return DeviceLock(None)
    return _PROCESS_LOCKS.setdefault(lock_path, DeviceLock(lock_path))


def exclusive_device(lock_path: str | None) -> AbstractContextManager[None]:
    """Hold the device alone while timing (see `DeviceLock`)."""
    return process_lock(lock_path).exclusive()


def shared_device(lock_path: str | None) -> AbstractContextManager[None]:
    """Share the device with other processes' checks, none of them timing meanwhile: for work
    on the GPU that is not a measurement (drawing inputs, compiling, checking outputs), so that
    it never runs under another process's timing."""
    return process_lock(lock_path).shared()
