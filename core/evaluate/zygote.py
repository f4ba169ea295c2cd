"""Where candidates' processes come from: a zygote forked by the judge after it imported torch and
Triton and before it touched CUDA, so that each candidate gets a process of its own in a few
milliseconds, with CUDA started fresh in it and nothing of any other candidate or of the judge.

The zygote lives in namespaces of its own (`sandbox.enter_namespaces`): a network namespace with
no network, shared by the candidates it forks, and a PID namespace of which it is PID 1. Each
candidate's process is PID 1 of yet another PID namespace (`sandbox.PidNamespaces`), with a
/proc of its own (`sandbox.mount_own_proc`, which CUDA needs): when it ends, the kernel kills
every process left in it, those in sessions or process groups of their own too. It confines
itself (`sandbox.confine`) and serves the judge (`core.evaluate.runner`) on a socket of its own.
The zygote reaps it, reports how it ended (signal, exit code, CPU seconds) and kills it when the
judge asks (the judge cannot name it: it sees other PIDs). The zygote dies with the judge, and a
candidate's process with the zygote.
"""

from __future__ import annotations

import contextlib
import faulthandler
import gc
import os
import select
import signal
import socket
import sys
import tempfile
import time
import traceback
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from core.evaluate.launchers import use_shared_launchers
from core.evaluate.sandbox import (
    Limits,
    PidNamespaces,
    SandboxError,
    confine,
    die_with_parent,
    enter_namespaces,
    mount_own_proc,
)
from core.evaluate.transport import TransportError, close_all, receive, send, socket_pair


@dataclass(frozen=True)
class Exit:
    """How a candidate's process ended."""

    signal: int | None
    code: int | None
    cpu_seconds: float

    def describe(self) -> str:
        if self.signal is not None:
            return f"signal {signal.Signals(self.signal).name}"
        return f"exit code {self.code}"


def _close_other_fds(keep: set[int]) -> None:
    for name in os.listdir("/proc/self/fd"):
        if int(name) > 2 and int(name) not in keep:
            with contextlib.suppress(OSError):
                os.close(int(name))


def _candidate_process(sock: socket.socket, request: dict[str, Any]) -> None:
    """The candidate's process: confine, then serve the judge until it closes the socket."""
    from core.evaluate.runner import Runner

    die_with_parent()
    scratch = Path(request["scratch"])
    os.chdir(scratch)
    for name, value in {"HOME": scratch, "TMPDIR": scratch,
                        "TRITON_CACHE_DIR": scratch / "triton"}.items():
        os.environ[name] = str(value)
    tempfile.tempdir = None  # read again from TMPDIR: the zygote's answer was /tmp
    sys.dont_write_bytecode = True  # the candidate's module is imported once, then deleted
    limits = Limits(**request["limits"])
    missing_launchers = (use_shared_launchers(Path(request["launchers"]))
                         if request.get("launchers") else [])
    confine(scratch, request["device"], limits)
    faulthandler.enable()
    device = torch.device(request["device"])
    if device.type == "cuda" and limits.device_memory_bytes:
        index = torch.cuda.current_device()  # the one CUDA_VISIBLE_DEVICES gives the worker
        total = torch.cuda.get_device_properties(index).total_memory
        torch.cuda.set_per_process_memory_fraction(
            min(1.0, limits.device_memory_bytes / total), index)
    Runner(sock, device, missing_launchers).serve()


class _Zygote:
    """The zygote's loop: spawn, kill and reap candidates' processes as the judge asks. The next
    candidate's process is forked ahead, while the judge works on the current one."""

    def __init__(self, sock: socket.socket, device: str) -> None:
        self.sock = sock
        self.device = device
        self.namespaces = PidNamespaces()
        self.live: set[int] = set()
        self.spare: tuple[int, socket.socket] | None = None
        self.wake_read, wake_write = os.pipe()
        os.set_blocking(wake_write, False)
        signal.set_wakeup_fd(wake_write)
        signal.signal(signal.SIGCHLD, lambda *_: None)

    def serve(self) -> None:
        self.fork_spare()
        while True:
            ready, _, _ = select.select([self.sock, self.wake_read], [], [])
            if self.wake_read in ready:
                os.read(self.wake_read, 4096)
            self.reap()
            if self.sock in ready:
                request, fds = receive(self.sock)
                if request is None:
                    return
                if request.get("op") == "spawn" and len(fds) == 1:
                    self.spawn(request, fds[0])
                else:
                    close_all(fds)
                    if request.get("op") == "kill" and request.get("pid") in self.live:
                        with contextlib.suppress(ProcessLookupError):
                            os.kill(request["pid"], signal.SIGKILL)

    def fork_spare(self) -> None:
        ours, theirs = socket_pair()
        self.namespaces.before_fork()
        pid = os.fork()
        if pid == 0:
            signal.set_wakeup_fd(-1)
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            self.sock.close()
            ours.close()
            try:
                _spare_process(theirs, self.device)
            except BaseException:  # noqa: BLE001 - a process's last words, for its verdict
                traceback.print_exc()
                os._exit(1)
            os._exit(0)
        self.namespaces.after_fork()
        theirs.close()
        self.live.add(pid)
        self.spare = (pid, ours)

    def spawn(self, request: dict[str, Any], candidate_fd: int) -> None:
        if self.spare is None:
            self.fork_spare()
        assert self.spare is not None
        pid, control = self.spare
        send(control, request, [candidate_fd])
        control.close()
        os.close(candidate_fd)
        # The judge goes on with this candidate while the next one's process is forked.
        send(self.sock, {"type": "spawned", "pid": pid})
        self.fork_spare()

    def reap(self) -> None:
        while self.live:
            try:
                pid, status, usage = os.wait4(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            if pid in self.live:
                self.live.discard(pid)
                if self.spare is not None and self.spare[0] == pid:
                    self.spare[1].close()
                    self.spare = None
                send(self.sock, {
                    "type": "exited", "pid": pid,
                    "signal": os.WTERMSIG(status) if os.WIFSIGNALED(status) else None,
                    "code": os.WEXITSTATUS(status) if os.WIFEXITED(status) else None,
                    "cpu_seconds": usage.ru_utime + usage.ru_stime})


def _spare_process(control: socket.socket, device: str) -> None:
    """A candidate's process before its candidate: on CUDA, start CUDA ahead; then wait for the
    judge's request and the socket to serve it on. (Warming up Python here too was tried on the
    CPU: it moves the pages a candidate's process copies from the zygote off the way to a
    verdict, but costs more CPU than it saves.)"""
    die_with_parent()
    mount_own_proc()
    startup_error = None
    if device == "cuda":
        try:
            start_cuda()
        except Exception as err:  # noqa: BLE001 - told once the judge watches this process
            startup_error = err
    request, fds = receive(control)
    control.close()
    if request is None or len(fds) != 1:
        return
    if startup_error is not None:
        raise RuntimeError(f"CUDA did not start in the candidate's process: "
                           f"{startup_error}") from startup_error
    _candidate_process(socket.socket(fileno=fds[0]), request)


def start_cuda() -> None:
    """Start CUDA and Triton's driver in a spare process, while the judge works on the candidate
    before: a context is driver work no fork can inherit, and Triton's driver module is loaded
    from the zygote's cache here, before the candidate's process gets a cache of its own (where
    it would be compiled anew for every candidate)."""
    import triton

    torch.zeros(1, device="cuda")
    triton.runtime.driver.active.get_current_device()


def _run_zygote(sock: socket.socket, device: str) -> None:
    """In the forked judge: take the namespaces, then run the zygote as PID 1 of its own."""
    die_with_parent()
    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(null, 0)
    os.dup2(2, 1)
    _close_other_fds({sock.fileno()})
    try:
        enter_namespaces()
    except (SandboxError, OSError) as err:
        send(sock, {"type": "failed", "error": str(err)})
        return
    pid = os.fork()
    if pid == 0:
        die_with_parent()
        try:
            mount_own_proc()  # as every candidate's process will: refused here, said here
        except (SandboxError, OSError) as err:
            send(sock, {"type": "failed", "error": str(err)})
            return
        warm_up(device)
        # Everything alive now stays: the collector of a candidate's process then leaves it
        # untouched, and so shared with the zygote rather than copied page by page.
        gc.freeze()
        send(sock, {"type": "ready"})
        _Zygote(sock, device).serve()
        return
    sock.close()
    os.waitpid(pid, 0)


def warm_up(device: str) -> None:
    """Do in the zygote the first-time work every candidate's process would repeat: on the CPU,
    judge a tiny candidate through the runner's own path (the guard's dispatch mode alone
    imports for most of a second); on CUDA the guard, with a CPU tensor, and Triton's compiler,
    with no GPU, since the zygote keeps away from the GPU, whose context a fork cannot share."""
    from core.evaluate.guard import Guard
    from core.evaluate.warm_kernel import compile_once, judge_once

    if device == "cpu":
        judge_once()
    else:
        with torch.no_grad(), Guard():
            torch.empty(8).fill_(1.0)
        compile_once()


class Zygote:
    """The judge's handle on its zygote."""

    def __init__(self, device: str, startup_timeout_s: float = 120.0,
                 launchers: Path | None = None) -> None:
        """`launchers`: the judge's folder of Triton launchers (`core.evaluate.launchers`),
        which candidates' processes read."""
        self.launchers = launchers
        ours, theirs = socket_pair()
        self.pid = os.fork()
        if self.pid == 0:
            ours.close()
            try:
                _run_zygote(theirs, device)
            except BaseException:  # noqa: BLE001 - the judge is told the zygote died
                traceback.print_exc()
                os._exit(1)
            os._exit(0)
        theirs.close()
        self.sock = ours
        self.exits: dict[int, Exit] = {}
        self.dropped: set[int] = set()
        ready = self._next(lambda m: m.get("type") in ("ready", "failed"), startup_timeout_s)
        if ready is None or ready.get("type") != "ready":
            self.close()
            why = "no answer" if ready is None else ready.get("error")
            raise SandboxError(f"the candidates' sandbox could not be built: {why}")

    def spawn(self, scratch: Path, device: str, limits: Limits,
              timeout_s: float = 60.0) -> tuple[int, socket.socket]:
        """A new candidate's process: its PID (in the zygote's namespace) and the judge's end
        of its socket."""
        judge_end, candidate_end = socket_pair()
        send(self.sock, {"op": "spawn", "scratch": str(scratch), "device": device,
                         "limits": asdict(limits),
                         "launchers": str(self.launchers) if self.launchers else None},
                  [candidate_end.fileno()])
        candidate_end.close()
        message = self._next(lambda m: m.get("type") == "spawned", timeout_s)
        if message is None:
            judge_end.close()
            raise TransportError("the zygote did not start a candidate's process")
        return int(message["pid"]), judge_end

    def kill(self, pid: int) -> None:
        """Kill the candidate's process `pid`; its exit report is not waited for."""
        self.dropped.add(pid)
        send(self.sock, {"op": "kill", "pid": pid})

    def wait_killed(self, pid: int, timeout_s: float) -> bool:
        """Whether the candidate's process `pid`, killed by `kill`, has exited: waits for its
        exit report `timeout_s` at most."""
        if pid in self.dropped:
            self._next(lambda m: m.get("type") == "exited" and m.get("pid") == pid, timeout_s)
        return pid not in self.dropped

    def exit_of(self, pid: int, timeout_s: float) -> Exit | None:
        """How the candidate's process `pid` ended, once it has."""
        if pid not in self.exits:
            self._next(lambda m: m.get("type") == "exited" and m.get("pid") == pid, timeout_s)
        return self.exits.pop(pid, None)

    def _next(self, wanted: Any, timeout_s: float) -> dict[str, Any] | None:
        deadline = time.monotonic() + timeout_s
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not select.select([self.sock], [], [], remaining)[0]:
                return None
            message, fds = receive(self.sock)
            close_all(fds)
            if message is None:
                raise TransportError("the zygote died")
            if message.get("type") == "exited" and message["pid"] in self.dropped:
                self.dropped.discard(message["pid"])
            elif message.get("type") == "exited":
                self.exits[int(message["pid"])] = Exit(message["signal"], message["code"],
                                                        float(message["cpu_seconds"]))
            if wanted(message):
                return message

    def close(self, timeout_s: float = 10.0) -> None:
        """Closing its socket ends the zygote's loop, and its candidates' processes with it;
        one that does not end in time is killed."""
        self.sock.close()
        deadline = time.monotonic() + timeout_s
        with contextlib.suppress(ChildProcessError):
            while os.waitpid(self.pid, os.WNOHANG) == (0, 0):
                if time.monotonic() > deadline:
                    os.kill(self.pid, signal.SIGKILL)
                    os.waitpid(self.pid, 0)
                    return
                time.sleep(0.01)
