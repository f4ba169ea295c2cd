"""A process that judges candidates, and the handle the parent keeps on it.

The worker is the judge (`core.evaluate.judge`): it never runs candidate code. Each candidate
runs in a sandboxed process of its own, forked from the worker's zygote (`core.evaluate.zygote`),
so a candidate that segfaults, hangs, exhausts memory or leaves its CUDA context unusable costs
only that process, and the worker goes on with the next candidate. The parent talks to the
worker over pipes, one JSON object per line, and keeps two time limits of its own, beyond the
judge's (`JUDGE_SLACK_S` later), in case the judge itself hangs: then the worker is killed and
replaced. Starting one (importing torch and Triton) costs seconds, so workers are reused.

Run as `python -m core.evaluate.worker FOLDER DEVICE`; the protocol's output goes to a private
copy of stdout, and everything else (the candidates' prints too) to FOLDER/stderr.log.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from core.evaluate.child_env import REPO_ROOT, child_env
from core.evaluate.verdict import Reason, Verdict
from core.runtime.errors import KilnInputError

STDERR_TAIL_CHARS = 3000
# The judge keeps the candidate's time limits; the parent's own come this much later.
JUDGE_SLACK_S = 60.0


class WorkerError(RuntimeError):
    """The worker failed in Kiln's own code (not the candidate's), or could not start."""


@dataclass
class Request:
    problem_path: str
    candidate_source: str
    config: dict[str, Any]
    tier: str
    anchors: list[str]


class Worker:
    """Parent-side handle on one worker process for one device type."""

    def __init__(self, device: str, startup_timeout_s: float,
                 env: dict[str, str] | None = None) -> None:
        """`env`: variables set in the worker's environment on top of this process's (its GPU)."""
        self.device = device
        self.folder = Path(tempfile.mkdtemp(prefix="kiln-worker-"))
        self.stderr_path = self.folder / "stderr.log"
        env = child_env(device, env)
        with self.stderr_path.open("ab") as stderr:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "core.evaluate.worker", str(self.folder), device],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=stderr, env=env,
                cwd=REPO_ROOT, start_new_session=True,
            )
        self.buffer = b""
        message = self.receive(time.monotonic() + startup_timeout_s)
        if message is not None and message["type"] == "input_error":
            self.kill()
            raise KilnInputError(message["problem"], message["fix"])
        if message is None or message["type"] != "ready":
            self.kill()
            raise WorkerError(f"a {device} worker did not start within {startup_timeout_s:.0f}s:"
                              f"\n{self.stderr_tail(0)}")

    @property
    def alive(self) -> bool:
        return self.process.poll() is None

    def send(self, message: dict[str, Any]) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write((json.dumps(message) + "\n").encode())
        self.process.stdin.flush()

    def receive(self, deadline: float) -> dict[str, Any] | None:
        """The next message; None when the deadline passed; {"type": "eof"} when the worker's
        end of the pipe closed (it died)."""
        assert self.process.stdout is not None
        fd = self.process.stdout.fileno()
        while b"\n" not in self.buffer:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None
            ready, _, _ = select.select([fd], [], [], remaining)
            if not ready:
                return None
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                return {"type": "eof"}
            self.buffer += chunk
        line, self.buffer = self.buffer.split(b"\n", 1)
        return json.loads(line)

    def evaluate(self, request: Request, compile_timeout_s: float, run_timeout_s: float
                 ) -> Verdict:
        stderr_start = self.stderr_path.stat().st_size
        self.send({"type": "judge", **request.__dict__})
        compile_timeout_s += JUDGE_SLACK_S
        run_timeout_s += JUDGE_SLACK_S
        phase, deadline = "compile", time.monotonic() + compile_timeout_s
        while True:
            message = self.receive(deadline)
            if message is None:
                return self.timed_out(phase, compile_timeout_s if phase == "compile"
                                      else run_timeout_s)
            kind = message["type"]
            if kind == "eof":
                return self.crashed(phase, stderr_start)
            if kind == "phase":
                phase, deadline = "run", time.monotonic() + run_timeout_s
            elif kind == "verdict":
                if not message["healthy"]:
                    self.close()
                return Verdict.from_dict(message["verdict"])
            elif kind == "input_error":
                raise KilnInputError(message["problem"], message["fix"])
            else:
                self.kill()
                raise WorkerError(f"the worker failed in Kiln's code:\n{message['traceback']}")

    def timed_out(self, phase: str, limit: float) -> Verdict:
        self.kill()
        return Verdict.rejected(
            Reason.TIMEOUT,
            f"no verdict within the {phase} time limit of {limit:g}s (the judge's own, beyond "
            "the candidate's): its worker was killed",
            timed_out=True, compiled=phase == "run",
        )

    def crashed(self, phase: str, stderr_start: int) -> Verdict:
        try:
            code = self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.kill()
            code = self.process.returncode
        how = f"signal {signal.Signals(-code).name}" if code < 0 else f"exit code {code}"
        return Verdict.rejected(
            Reason.CRASH,
            f"the worker died ({how}) while judging the candidate: "
            f"{self.stderr_tail(stderr_start)}",
            crashed=True, compiled=phase == "run",
        )

    def stderr_tail(self, start: int) -> str:
        with self.stderr_path.open("rb") as handle:
            handle.seek(start)
            text = handle.read().decode(errors="replace").strip()
        return text[-STDERR_TAIL_CHARS:] or "(nothing on stderr)"

    def kill(self) -> None:
        if self.alive:
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait()

    def close(self) -> None:
        if self.alive:
            assert self.process.stdin is not None
            self.process.stdin.close()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.kill()
        shutil.rmtree(self.folder, ignore_errors=True)


def prepare_judging(device: str) -> None:
    """What a judging process sets up before it forks its zygote: one intra-op thread on the
    CPU (a verdict's timings then repeat on a loaded machine), the stored CUDA sources' runtime
    module, and the launch counters the guard reads."""
    import torch

    from core.evaluate.guard import install_launch_counters
    from core.runtime import cuda as cuda_runtime

    if device == "cpu":
        torch.set_num_threads(1)
    else:
        # pycuda's launchers are wrapped only once it is imported: here, before the zygote
        # forks, or a CUDA candidate's launches go uncounted in its process.
        with contextlib.suppress(ImportError):
            import pycuda.driver  # noqa: F401
    sys.modules.setdefault("cuda_runtime", cuda_runtime)
    install_launch_counters()


def serve(folder: Path, device: str) -> None:
    """The worker's loop: judge requests from stdin until it closes or the worker is unfit."""
    protocol = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)

    def send(message: dict[str, Any]) -> None:
        protocol.write(json.dumps(message) + "\n")

    import torch  # start-up cost is paid before "ready", not by the first candidate

    from core.evaluate.config import EvalConfig
    from core.evaluate.judge import Judge
    from core.evaluate.sandbox import SandboxError, require_sandbox

    try:
        require_sandbox()
    except KilnInputError as err:
        send({"type": "input_error", "problem": err.problem, "fix": err.fix})
        return
    prepare_judging(device)
    try:
        judge = Judge.start(folder, device)
    except SandboxError as err:
        send({"type": "input_error", "problem": str(err),
              "fix": "judge where a process may make network and PID namespaces (root, or "
                     "unprivileged user namespaces enabled) and Landlock is enabled"})
        return
    send({"type": "ready"})
    for line in sys.stdin:
        request = json.loads(line)
        config = EvalConfig.from_dict(request["config"])
        try:
            verdict, healthy = judge.judge(
                request["problem_path"], request["candidate_source"], config,
                set(request["anchors"]), lambda phase: send({"type": "phase", "phase": phase}),
            )
        except KilnInputError as err:
            send({"type": "input_error", "problem": err.problem, "fix": err.fix})
            continue
        except Exception:
            import traceback

            send({"type": "internal_error", "traceback": traceback.format_exc()})
            raise
        if config.device == "cuda" and healthy:
            # The pool hands this candidate's memory to another worker once the verdict is
            # out: the blocks the candidate's process let go of, and the allocator's cached
            # blocks, go back to the device first.
            torch.cuda.ipc_collect()
            torch.cuda.empty_cache()
        send({"type": "verdict", "verdict": verdict.to_dict(), "healthy": healthy})
        if not healthy:
            break
    judge.zygote.close()


if __name__ == "__main__":
    serve(Path(sys.argv[1]), sys.argv[2])
