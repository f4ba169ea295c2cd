"""The candidate's own process: import the candidate, build `ModelNew`, answer the judge's calls.

It runs sandboxed (`core.evaluate.sandbox`), one process per candidate, and hands back only what
the judge asks of a call: the outputs (shared memory, `core.evaluate.exchange`), the call's
milliseconds, its kernel launches, the torch ops it ran and the state of the guard bands around
the buffers it allocated. Every call takes the same path, whether the judge checks it or times it:
buffers for the allocations of the call before are made ready (`Guard.prepare`), the L2 cache is
flushed, and the call runs under the guard between the timer's marks.

What it reports about itself (launches, ops, guard bands) is only as honest as the static rules
keep the candidate; the judge checks from outside what it can (outputs, the inputs' bands and
values). The messages it sends are JSON.
"""

from __future__ import annotations

import base64
import pickle
import socket
import traceback
from pathlib import Path
from types import ModuleType
from typing import Any

import torch

from core.evaluate.exchange import CandidateSide, decode, encode, handing_over
from core.evaluate.guard import Allocation, Guard
from core.evaluate.transport import close_all, receive, send
from core.runtime.problem_loader import import_file, seed_device
from core.timing.model_timing import make_flush
from core.timing.precision import hold_candidate_to
from core.timing.timer import SITE_QUEUE_MARGIN_MS, QueueAhead, synchronize, time_once


def error_report(err: BaseException, candidate_path: Path) -> dict[str, Any]:
    """What the judge needs to classify an exception: its classes, text, the candidate's frames
    and, for a compiler's error, its log."""
    frames = [f for f in traceback.extract_tb(err.__traceback__)
              if f.filename == str(candidate_path)]
    lines = [f"  line {f.lineno}, in {f.name}: {f.line}" for f in frames]
    log = str(err)
    if isinstance(err, SyntaxError):
        log = f"line {err.lineno}: {err.msg}\n    {(err.text or '').rstrip()}"
    stderr = getattr(err, "stderr", None)
    if isinstance(stderr, str | bytes) and stderr:
        log = f"{log}\n{stderr if isinstance(stderr, str) else stderr.decode(errors='replace')}"
    return {"names": [cls.__name__ for cls in type(err).__mro__],
            "text": f"{type(err).__name__}: {err}"[:4000],
            "detail": "\n".join([*lines, f"{type(err).__name__}: {err}"])[-4000:],
            "log": log[-8000:]}


class Runner:
    def __init__(self, sock: socket.socket, device: torch.device,
                 missing_launchers: list[list[str]] | None = None) -> None:
        self.sock = sock
        # The very list `launchers.use_shared_launchers` fills as kernels launch: empty when given.
        self.missing_launchers = [] if missing_launchers is None else missing_launchers
        self.device = device
        self.side = CandidateSide(device)
        self.model: torch.nn.Module | None = None
        self.module: ModuleType | None = None
        self.candidate_path = Path()
        self.allocations: list[Allocation] = []
        self.flush = make_flush(device)
        # Every call is timed as its device's work alone: the guard's Python around it is the
        # evaluator's, which the installed kernel never runs (core.timing.timer).
        self.queue = QueueAhead(device, SITE_QUEUE_MARGIN_MS) if device.type == "cuda" else None

    def serve(self) -> None:
        while True:
            message, fds = receive(self.sock)
            if message is None:
                return
            try:
                reply, reply_fds = self.handle(message, fds)
            except Exception as err:  # the candidate's failure is the judge's to classify
                reply, reply_fds = {"type": "error",
                                    "error": error_report(err, self.candidate_path)}, []
            finally:
                close_all([fd for fd in fds if fd >= 0])
            send(self.sock, reply, reply_fds)
            self.side.keep.clear()

    def handle(self, message: dict[str, Any], fds: list[int]) -> tuple[dict[str, Any], list[int]]:
        op = message.get("op")
        if op == "build":
            return self.build(message, fds), []
        if op == "call":
            return self.call(message, fds)
        if op == "forget":
            self.forget(message.get("numbers", []))
            return {"type": "forgotten"}, []
        if op == "report":
            from core.evaluate.kernel_report import triton_report

            return {"type": "report", "report": triton_report(self.module).to_dict()}, []
        if op == "stats":
            peak = (torch.cuda.max_memory_allocated(self.device)
                    if self.device.type == "cuda" else None)
            return {"type": "stats", "peak_memory_bytes": peak,
                    "launchers": self.missing_launchers}, []
        raise ValueError(f"unknown request {op!r}")

    def forget(self, numbers: list[int]) -> None:
        """Let go of the judge's buffers `numbers`, and free the outputs this process sent that
        the judge has let go of: memory shared over CUDA IPC waits, allocated, until its
        sender collects it (torch frees it unasked only when an allocation fails)."""
        with handing_over("letting go of shared tensors"):
            self.side.forget(numbers)
            if self.device.type == "cuda":
                torch.cuda.ipc_collect()

    def build(self, message: dict[str, Any], fds: list[int]) -> dict[str, Any]:
        self.candidate_path = Path(message["path"])
        init = pickle.loads(base64.b64decode(message["init"]))  # from the judge, trusted
        hold_candidate_to(bool(message["tf32"]))
        self.module = import_file(self.candidate_path, message["module"])
        if not hasattr(self.module, "ModelNew"):
            return {"type": "no_model_new"}
        seed_device(message["seed"], self.device)  # as the judge builds the reference
        self.model = self.module.ModelNew(*init).to(self.device).eval()
        return {"type": "built"}

    def call(self, message: dict[str, Any], fds: list[int]) -> tuple[dict[str, Any], list[int]]:
        assert self.model is not None, "call before build"
        self.forget(message.get("forget", []))
        with handing_over("receiving the inputs", every_error=True):
            inputs = [decode(record, lambda r: self._input(r, fds))
                      for record in message["inputs"]]
        guard = Guard()
        guard.prepare(self.allocations)
        self.flush()
        synchronize(self.device)
        returned: list[object] = []
        with torch.no_grad(), guard:
            milliseconds = time_once(lambda: returned.append(self.model(*inputs)), self.device,
                                     self.queue)
        self.allocations = guard.allocations
        self.side.keep += [returned, guard]  # the outputs' memory, alive until the reply is sent
        out_fds: list[int] = []
        with handing_over("sending the outputs"):
            outputs = encode(returned[0], lambda t: self.side.export_output(t, out_fds,
                                                                            guard.buffers))
        return {"type": "result", "outputs": outputs, "ms": milliseconds,
                "launches": guard.launches, "ops": dict(guard.ops),
                "launch_ops": dict(guard.launch_ops), "out_of_bounds": guard.out_of_bounds(),
                "library_ops": guard.library_ops(), "compute_ops": guard.compute_ops()}, out_fds

    def _input(self, record: dict[str, Any], fds: list[int]) -> torch.Tensor:
        tensor = self.side.load_input(record, fds)
        if isinstance(record.get("fd"), int):
            fds[record["fd"]] = -1  # mapped: its region owns it now
        return tensor
