"""The judge's handle on one candidate's process: build the candidate there, call it on inputs
the judge allocated, get back its outputs and what its guard saw, end it.

Every failure of the candidate becomes a `Rejected` here: an exception it raised (classified
from the report its process sends), a death (a signal, its CPU time limit), silence past a
deadline (the process and everything it started are killed). None of it touches the judge.
"""

from __future__ import annotations

import base64
import contextlib
import pickle
import select
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from core.evaluate.exchange import (
    HandOverFailed,
    JudgeSide,
    close_unused,
    decode,
    load_output,
)
from core.evaluate.sandbox import Limits
from core.evaluate.transport import TransportError, receive, send
from core.evaluate.verdict import Reason
from core.evaluate.zygote import Zygote
from core.runtime.errors import OOM_MARKERS
from core.timing.timer import synchronize

COMPILE_ERRORS = ("CompilationError", "CompileError", "CompileTimeAssertionFailure")
CUDA_ERROR_MARKERS = ("CUDA error", "illegal memory access", "LaunchError", "cudaError",
                      "misaligned address", "unspecified launch failure")
STDERR_TAIL_CHARS = 3000
EXIT_WAIT_S = 30.0


class Rejected(Exception):  # noqa: N818 - control flow: a verdict found mid-way
    def __init__(self, code: Reason, reason: str, compiled: bool = True, log: str = "",
                 healthy: bool = True, crashed: bool = False, timed_out: bool = False) -> None:
        super().__init__(reason)
        self.code, self.reason, self.compiled, self.log = code, reason, compiled, log
        self.healthy, self.crashed, self.timed_out = healthy, crashed, timed_out


def hand_over_rejection(text: str) -> Rejected:
    """Tensors that could not cross between the judge and the candidate's process, in either
    of them: the evaluator's failure, judged again once on a fresh worker."""
    return Rejected(Reason.JUDGE_ERROR, f"the evaluator could not move tensors between the "
                                        f"judge and the candidate's process: {text}",
                    healthy=False)


def classify(report: dict[str, Any]) -> Rejected:
    """The rejection for an exception the candidate raised, from its process's report."""
    names, text = set(report.get("names", [])), str(report.get("text", ""))
    detail, log = str(report.get("detail", text)), str(report.get("log", text))
    if "HandOverFailed" in names:  # raised in the candidate's process (`exchange.handing_over`)
        return hand_over_rejection(text)
    if names & set(COMPILE_ERRORS) or "SyntaxError" in names:
        first = log.splitlines()[0] if log.strip() else text
        return Rejected(Reason.COMPILE_ERROR, f"does not compile: {first}", compiled=False,
                        log=log)
    if "OutOfMemoryError" in names or any(m in text for m in OOM_MARKERS):
        return Rejected(Reason.OUT_OF_MEMORY, f"ran out of memory: {detail}")
    if any(marker in text for marker in CUDA_ERROR_MARKERS):
        return Rejected(Reason.CUDA_ERROR, f"CUDA error (its process's context is now "
                                           f"unusable, and its process was ended): {detail}")
    return Rejected(Reason.RUNTIME_ERROR, f"raised {detail}")


@dataclass
class CallResult:
    outputs: object
    milliseconds: float
    launches: int
    out_of_bounds: list[str]
    compute_ops: list[str]
    library_ops: list[str]
    ops: dict[str, int] = field(default_factory=dict)


class CandidateProcess:
    """One candidate's sandboxed process, from `Zygote.spawn` to `close`."""

    def __init__(self, zygote: Zygote, scratch: Path, device: torch.device, limits: Limits,
                 log_path: Path) -> None:
        self.zygote, self.device, self.limits, self.log_path = zygote, device, limits, log_path
        self.log_start = log_path.stat().st_size if log_path.exists() else 0
        self.pid, self.sock = zygote.spawn(scratch, device.type, limits)
        self.side = JudgeSide()
        self.phase = "compile"
        self.ended = self.exited = False
        self.unsure: list[int] = []  # buffers it may hold: asked to let go, it gave no answer

    def build(self, candidate_path: Path, module_name: str, init: list[object], seed: int,
              tf32: bool, deadline: float) -> None:
        """Import the candidate and make its ModelNew; `tf32`: whether its fp32 products may
        multiply as TF32 (`core.timing.precision.hold_candidate_to`)."""
        reply, fds = self.request(
            {"op": "build", "path": str(candidate_path), "module": module_name, "seed": seed,
             "tf32": tf32, "init": base64.b64encode(pickle.dumps(init)).decode()}, [], deadline)
        close_unused(fds, set())
        if reply.get("type") == "no_model_new":
            raise Rejected(Reason.NO_MODEL_NEW, "the candidate defines no ModelNew",
                           compiled=False)
        if reply.get("type") == "error":
            rejection = classify(reply.get("error", {}))
            if rejection.code is Reason.RUNTIME_ERROR:
                rejection.code, rejection.compiled = Reason.INIT_ERROR, False
            raise rejection

    def call(self, inputs: list[object], deadline: float) -> CallResult:
        records, fds = self.side.encode_inputs(inputs)
        synchronize(self.device)  # the judge's copies are in memory before the call reads them
        forget = self.side.take_dropped()
        try:
            reply, reply_fds = self.request(
                {"op": "call", "inputs": records, "forget": forget}, fds, deadline)
        except Rejected:
            self.unsure += forget
            raise
        self.side.keep = []
        used: set[int] = set()
        try:
            if reply.get("type") == "error":
                raise classify(reply.get("error", {}))
            if reply.get("type") != "result":
                raise TransportError(f"an unexpected reply {reply.get('type')!r}")
            outputs = decode(reply["outputs"], load_output(reply_fds, used, self.device))
            return CallResult(outputs, float(reply["ms"]), int(reply["launches"]),
                              [str(x) for x in reply["out_of_bounds"]],
                              [str(x) for x in reply["compute_ops"]],
                              [str(x) for x in reply["library_ops"]],
                              {str(k): int(v) for k, v in reply["ops"].items()})
        except HandOverFailed as err:  # raised here, mapping the outputs
            raise hand_over_rejection(f"{type(err).__name__}: {err}") from err
        except (TransportError, KeyError, TypeError, ValueError) as err:
            raise Rejected(Reason.RUNTIME_ERROR, f"its process answered out of protocol: "
                                                 f"{err}") from err
        finally:
            close_unused(reply_fds, used)

    def release(self, deadline: float) -> None:
        """Before the judge allocates new copies or runs the reference: the process lets go of
        the copies the judge has forgotten, and the judge frees them (until both sides have let
        go, CUDA IPC keeps memory allocated, as shared memory on the CPU stays mapped, and a
        trial's copies would pile up on the last ones)."""
        if not self.side.dropped:
            return
        numbers = self.side.take_dropped()
        try:
            reply, fds = self.request({"op": "forget", "numbers": numbers}, [], deadline)
        except Rejected:
            self.unsure += numbers
            raise
        close_unused(fds, set())
        if reply.get("type") == "error":
            raise classify(reply.get("error", {}))
        if self.device.type == "cuda":
            torch.cuda.ipc_collect()

    def let_go_of_everything(self, deadline: float) -> bool:
        """Before the process ends: it lets go of every buffer of the judge's it holds, and the
        judge frees them. A process that ends holding some never gives them back: CUDA IPC keeps
        them allocated in the judge for as long as the judge lives (an input's size each, GBs at
        real sizes), so once a process that died or was killed holding some has exited, the
        judge gives back its references itself. False when some may still be held: the process
        would not answer a request to let go of them, or did not exit."""
        if self.device.type != "cuda":
            return True
        held = sorted(self.side.sent) + self.side.take_dropped()
        self.side.sent.clear()
        if held and not self.ended:
            reply: dict[str, Any] = {}
            with contextlib.suppress(Rejected):
                reply, fds = self.request({"op": "forget", "numbers": held}, [], deadline)
                close_unused(fds, set())
            if reply.get("type") != "forgotten":
                self.unsure += held  # it may have let go of some before it failed
        elif held and self.end():
            self.side.release_counts(held)
        elif held:
            self.unsure += held
        torch.cuda.ipc_collect()
        return not self.unsure

    def kernel_report(self, deadline: float) -> dict[str, Any]:
        """What the compiler made of the candidate's Triton kernels, read in its process."""
        reply, fds = self.request({"op": "report"}, [], deadline)
        close_unused(fds, set())
        report = reply.get("report")
        return report if isinstance(report, dict) else {}

    def stats(self, deadline: float) -> tuple[int | None, object]:
        """The process's peak device memory, and the signatures of the Triton launchers it
        built itself (unchecked: the candidate's word)."""
        reply, fds = self.request({"op": "stats"}, [], deadline)
        close_unused(fds, set())
        peak = reply.get("peak_memory_bytes")
        return (peak if isinstance(peak, int) else None), reply.get("launchers")

    def request(self, message: dict[str, Any], fds: list[int], deadline: float
                ) -> tuple[dict[str, Any], list[int]]:
        try:
            send(self.sock, message, fds)
        except OSError:
            self.died()
        remaining = deadline - time.monotonic()
        if remaining <= 0 or not select.select([self.sock], [], [], remaining)[0]:
            self.kill()
            limit = self.limits.cpu_seconds
            raise Rejected(Reason.TIMEOUT, f"no answer within the {self.phase} time limit: the "
                           f"candidate hangs or is far too slow (CPU limit {limit:g}s); its "
                           "process was killed", compiled=self.phase != "compile",
                           timed_out=True)
        try:
            reply, reply_fds = receive(self.sock)
        except (OSError, TransportError):
            reply, reply_fds = None, []
        if reply is None:
            self.died()
        return reply, reply_fds

    def died(self) -> None:
        """The candidate's process ended on its own: why, as a rejection."""
        self.ended = True
        self.sock.close()
        ended = self.zygote.exit_of(self.pid, EXIT_WAIT_S)
        if ended is None:
            with contextlib.suppress(OSError):
                self.zygote.kill(self.pid)
        self.exited = ended is not None
        compiled = self.phase != "compile"
        if (ended is not None and ended.signal in (signal.SIGKILL, signal.SIGXCPU)
                and ended.cpu_seconds >= self.limits.cpu_seconds - 0.5):
            raise Rejected(Reason.TIMEOUT, f"used up its CPU time limit of "
                                           f"{self.limits.cpu_seconds:g}s: the candidate hangs "
                                           "or is far too slow; its process was killed",
                           compiled=compiled, timed_out=True)
        how = ended.describe() if ended is not None else "no exit status"
        raise Rejected(Reason.CRASH, f"its process died ({how}) while running the candidate: "
                                     f"{self.stderr_tail()}", compiled=compiled, crashed=True)

    def stderr_tail(self) -> str:
        with contextlib.suppress(OSError), self.log_path.open("rb") as handle:
            handle.seek(self.log_start)
            text = handle.read().decode(errors="replace").strip()
            return text[-STDERR_TAIL_CHARS:] or "(nothing on stderr)"
        return "(no stderr)"

    def kill(self) -> None:
        """End the candidate's process, and with it its PID namespace: everything it started
        (the kernel kills the namespace as its first process ends)."""
        if not self.ended:
            self.ended = True
            self.sock.close()
            with contextlib.suppress(OSError):
                self.zygote.kill(self.pid)

    def end(self) -> bool:
        """Kill the process if it still runs and wait until it has exited, its mappings of the
        judge's memory gone with it: whether it has within EXIT_WAIT_S."""
        self.kill()
        if not self.exited:
            self.exited = self.zygote.wait_killed(self.pid, EXIT_WAIT_S)
        return self.exited

    def close(self) -> None:
        self.kill()
