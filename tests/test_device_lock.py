"""The machine-wide device lock: checks share the device, a timing holds it alone, a timer is
not starved by a stream of checks, and no two processes can wait on each other."""

from __future__ import annotations

import fcntl
import multiprocessing
import os
import subprocess
import sys
import time
from pathlib import Path

from core.evaluate.config import EvalConfig
from core.evaluate.pool import WorkerPool
from core.timing.device_lock import (
    DeviceLock,
    device_lock_path,
    exclusive_device,
    physical_gpu,
    process_lock,
    shared_device,
)

ROOT = Path(__file__).resolve().parent.parent


def checker(path: str, log: multiprocessing.Queue, rounds: int) -> None:
    """A judge's pattern: checks under the shared lock, a timing inside them, more checks."""
    pid = os.getpid()
    for _ in range(rounds):
        lock = DeviceLock(path)
        with lock.shared():
            log.put((pid, "shared", time.monotonic()))
            time.sleep(0.01)
            log.put((pid, "idle", time.monotonic()))
            with lock.exclusive():
                log.put((pid, "exclusive", time.monotonic()))
                time.sleep(0.01)
                log.put((pid, "idle", time.monotonic()))
            log.put((pid, "shared", time.monotonic()))
            time.sleep(0.01)
            log.put((pid, "idle", time.monotonic()))


def test_a_timing_never_overlaps_another_process_and_checks_overlap(tmp_path):
    path = str(tmp_path / "gpu-0.lock")
    log: multiprocessing.Queue = multiprocessing.Queue()
    workers = [multiprocessing.Process(target=checker, args=(path, log, 8)) for _ in range(4)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(timeout=60)
    assert not any(worker.is_alive() for worker in workers), "deadlock: a process never finished"
    assert all(worker.exitcode == 0 for worker in workers)
    events = []
    while len(events) < 4 * 8 * 6:
        events.append(log.get(timeout=5))
    state: dict[int, str] = {}
    most_sharing = 0
    for pid, what, _ in sorted(events, key=lambda event: event[2]):
        state[pid] = what
        others = [s for p, s in state.items() if p != pid and s != "idle"]
        assert not (what == "exclusive" and others), f"a timing overlapped {others}"
        assert not (what == "shared" and "exclusive" in others), "a check overlapped a timing"
        most_sharing = max(most_sharing, sum(s == "shared" for s in state.values()))
    assert most_sharing >= 2, "checks never ran side by side"


def test_a_waiting_timer_gets_in_while_checks_keep_coming(tmp_path):
    """Three processes take turns holding the lock shared, so that one of them always holds it:
    without the turnstile a timer waited up to 5 s for a moment when none did."""
    path = str(tmp_path / "gpu-0.lock")
    stop = tmp_path / "stop"
    hold = ("import sys, time, pathlib\nfrom core.timing.device_lock import DeviceLock\n"
            "ready = pathlib.Path(sys.argv[3])\n"
            "while not pathlib.Path(sys.argv[2]).exists():\n"
            "    with DeviceLock(sys.argv[1]).shared():\n"
            "        ready.touch()\n        time.sleep(0.05)\n")
    ready = [tmp_path / f"ready{i}" for i in range(3)]
    streams = [subprocess.Popen([sys.executable, "-c", hold, path, str(stop), str(flag)],
                                cwd=ROOT) for flag in ready]
    waits = []
    try:
        deadline = time.monotonic() + 60
        while not all(flag.exists() for flag in ready):
            assert time.monotonic() < deadline, "the checking processes never started"
            time.sleep(0.05)
        for _ in range(8):
            began = time.monotonic()
            with exclusive_device(path):
                waits.append(time.monotonic() - began)
            time.sleep(0.1)
    finally:
        stop.touch()
        for stream in streams:
            stream.wait(timeout=30)
    # With the turnstile a timer waits for the holds in progress, each 50 ms.
    assert max(waits) < 0.5, f"the timer waited {max(waits):.2f}s behind a stream of checks"


def test_a_released_lock_lets_a_child_process_hold_the_device(tmp_path):
    path = str(tmp_path / "gpu-0.lock")
    take = ("import sys\nfrom core.timing.device_lock import exclusive_device\n"
            "with exclusive_device(sys.argv[1]):\n    print('held')\n")
    lock = DeviceLock(path)
    with lock.shared(), lock.released():
        child = subprocess.run([sys.executable, "-c", take, path], cwd=ROOT, timeout=30,
                               capture_output=True, text=True)
    assert child.stdout.strip() == "held", child.stderr
    assert lock.mode == 0 and lock.handle is None


def test_a_timing_inside_the_process_own_shared_hold_changes_its_mode(tmp_path):
    """An end-to-end check shares the device for its compiles and output checks, and times
    inside that hold: the timing takes the process's one lock exclusive instead of waiting on
    a second handle of its own, and another process times only when neither is held."""
    path = str(tmp_path / "gpu-0.lock")
    take = ("import sys\nfrom core.timing.device_lock import exclusive_device\n"
            "with exclusive_device(sys.argv[1]):\n    print('held')\n")
    with shared_device(path):
        other = subprocess.Popen([sys.executable, "-c", take, path], cwd=ROOT, text=True,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        time.sleep(1.0)
        assert other.poll() is None, "another process timed under this one's shared hold"
        with exclusive_device(path):
            assert process_lock(path).mode == fcntl.LOCK_EX
        assert process_lock(path).mode == fcntl.LOCK_SH
    out, err = other.communicate(timeout=30)
    assert out.strip() == "held", err
    assert process_lock(path).mode == 0 and process_lock(path).handle is None


def test_one_lock_per_physical_device_shared_by_every_pool():
    assert device_lock_path("cpu").endswith(f"kiln-device-locks-{os.getuid()}/cpu.lock")
    assert device_lock_path("cuda", "3").endswith("/gpu-3.lock")
    assert physical_gpu(1, {"CUDA_VISIBLE_DEVICES": "2,3"}) == "3"
    pool = WorkerPool(EvalConfig(device="cpu"), workers=2)
    assert pool.lock_path(0) == pool.lock_path(1) == device_lock_path("cpu")
    pool.close()
