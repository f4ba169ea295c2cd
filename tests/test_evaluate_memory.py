"""The evaluator's memory: a judged problem costs a few times its inputs and outputs, however
large; the workers of a pool share a budget of device memory; the sizes come from meta tensors."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

from bench.processes import descendants, process_table
from core.evaluate import EvalConfig, Evaluator
from core.evaluate.candidate import CallResult
from core.evaluate.exchange import SharedInput
from core.evaluate.memory import JUDGE_FACTOR, DeviceLedger, MemoryBudget, problem_bytes
from core.evaluate.trial import Models, run_trial

MIB = 1 << 20
# Beyond the judge's multiple of the problem's bytes: a comparison's pieces, a fingerprint's
# temporaries and the interpreter's blocks, whatever the problem's size.
FIXED_OVERHEAD = 256 * MIB

PROBLEM = """
import torch
import torch.nn as nn

N = {n}


class Model(nn.Module):
    def forward(self, x, y):
        return x * y + x


def get_inputs():
    return [torch.randn(N), torch.randn(N)]


def get_init_inputs():
    return []
"""

# A million values a program: few programs for the interpreter, which runs each block as one
# array. A GPU compiles such a block for minutes (each thread would hold thousands of values).
CANDIDATE = """
import torch
import torch.nn as nn
import triton
import triton.language as tl

BLOCK = 1 << 20


@triton.jit
def fused(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    x = tl.load(x_ptr + offsets, mask=mask)
    y = tl.load(y_ptr + offsets, mask=mask)
    tl.store(out_ptr + offsets, x * y + x, mask=mask)


class ModelNew(nn.Module):
    def forward(self, x, y):
        out = torch.empty_like(x)
        fused[(triton.cdiv(x.numel(), BLOCK),)](x, y, out, x.numel(), BLOCK=BLOCK)
        return out
"""


def write_problem(folder: Path, name: str, n: int) -> Path:
    path = folder / f"{name}.py"
    path.write_text(PROBLEM.format(n=n))
    return path


def test_sizes_come_from_meta_tensors(tmp_path):
    sizes = problem_bytes(write_problem(tmp_path, "p", 1000))
    assert (sizes.inputs, sizes.outputs) == (2 * 4000, 4000)
    assert sizes.needed == JUDGE_FACTOR * 12000


class TreeMemory:
    """The proportional resident memory (Pss: shared pages split between their sharers) of a
    process and every process below it, sampled until stopped; the peak of the sum."""

    def __init__(self, root: int, period_s: float = 0.002) -> None:
        self.root, self.peak, self.samples = root, 0, 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._sample, args=(period_s,), daemon=True)

    def now(self) -> int:
        total = 0
        for pid in descendants(self.root, process_table()):
            try:
                rollup = Path(f"/proc/{pid}/smaps_rollup").read_text()
            except OSError:  # it ended while read
                continue
            total += sum(int(line.split()[1]) * 1024 for line in rollup.splitlines()
                         if line.startswith("Pss:"))
        return total

    def _sample(self, period_s: float) -> None:
        while not self.stop.wait(period_s):
            self.peak = max(self.peak, self.now())
            self.samples += 1

    def __enter__(self) -> TreeMemory:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join()


@pytest.mark.skipif(not Path("/proc/self/smaps_rollup").exists(),
                    reason="needs Linux's /proc/PID/smaps_rollup")
def test_a_large_problem_costs_its_process_tree_a_few_times_its_bytes(tmp_path):
    """Inputs of 2 x 64 MiB and an output of 64 MiB: the worker and every process below it
    (its zygote, the candidate's process) grow together by at most three times those bytes
    (plus a fixed overhead) over what they held before."""
    n = 16 * MIB
    small, large = write_problem(tmp_path, "small", 1037), write_problem(tmp_path, "large", n)
    config = EvalConfig(device="cpu", trials=2, warmup=1)
    with Evaluator(config, workers=1) as evaluator:
        assert evaluator.evaluate(small, CANDIDATE).correct
        memory = TreeMemory(evaluator.pool.workers[0].process.pid)
        before = memory.now()
        with memory:
            verdict = evaluator.evaluate(large, CANDIDATE)
    assert verdict.correct, verdict.reason
    assert memory.samples > 10, "too few samples of the tree's memory to find its peak"
    io_bytes = 3 * n * 4
    growth = memory.peak - before
    assert growth <= JUDGE_FACTOR * io_bytes + FIXED_OVERHEAD, (
        f"the worker's process tree grew by {growth / MIB:.0f} MiB judging a problem of "
        f"{io_bytes / MIB:.0f} MiB of inputs and outputs; the bound is {JUDGE_FACTOR}x plus "
        f"{FIXED_OVERHEAD / MIB:.0f} MiB")
    assert growth >= io_bytes, "the candidate's inputs and output were not seen in the tree"
    assert set(verdict.phase_seconds) >= {"candidate start", "compile", "checks", "timing",
                                          "ending"}
    assert sum(verdict.phase_seconds.values()) <= verdict.eval_seconds, verdict.phase_seconds


def test_reservations_wait_for_room_and_a_large_one_runs_alone():
    budget = MemoryBudget({0: 100})
    order: list[str] = []

    def hold(name: str, needed: int, seconds: float) -> None:
        with budget.reserve(0, needed):
            order.append(f"{name} in")
            time.sleep(seconds)
            order.append(f"{name} out")

    first = threading.Thread(target=hold, args=("a", 70, 0.3))
    first.start()
    while not order:
        time.sleep(0.01)
    # 70 + 40 > 100: b waits for a; 500 never fits, so it waits until the GPU is free.
    second = threading.Thread(target=hold, args=("b", 40, 0.0))
    huge = threading.Thread(target=hold, args=("c", 500, 0.0))
    second.start()
    huge.start()
    for thread in (first, second, huge):
        thread.join(timeout=30)
    assert order[:2] == ["a in", "a out"]
    assert sorted(order[2:]) == ["b in", "b out", "c in", "c out"]
    # Each of b and c held the budget alone.
    assert order[3] == order[2].replace(" in", " out")
    assert budget.held == {0: 0}


@pytest.mark.gpu
def test_peak_device_memory_is_a_few_times_the_problems_bytes(tmp_path):
    n = 64 * MIB
    problem = write_problem(tmp_path, "large", n)
    with Evaluator(EvalConfig(device="cuda"), workers=1) as evaluator:
        verdict = evaluator.evaluate(problem, CANDIDATE.replace("BLOCK = 1 << 20", "BLOCK = 1024"))
    assert verdict.correct, verdict.reason
    io_bytes = 3 * n * 4
    assert verdict.peak_memory_bytes is not None
    # The L2 flush buffer (twice the L2) and the pieces' temporaries are the fixed part.
    assert verdict.peak_memory_bytes <= JUDGE_FACTOR * io_bytes + FIXED_OVERHEAD, (
        verdict.peak_memory_bytes / MIB, io_bytes / MIB)


def test_the_ledger_shares_a_gpu_between_processes_and_forgets_dead_ones(tmp_path):
    gpu = f"test-{tmp_path.name}"
    ledger, other = DeviceLedger(gpu, 100, poll_s=0.01), DeviceLedger(gpu, 100, poll_s=0.01)
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)
    ledger.path.write_text(json.dumps({f"{dead.stdout.strip()}:candidate:1": 90}))
    try:
        with ledger.hold("process", 30), ledger.hold("candidate", 50):
            # The dead process's 90 are gone; 30 + 50 are held, so 40 more must wait.
            assert sorted(ledger.entries().values()) == [30, 50]
            waited: list[float] = []

            def take() -> None:
                began = time.monotonic()
                with other.hold("candidate", 40):
                    waited.append(time.monotonic() - began)

            thread = threading.Thread(target=take)
            thread.start()
            time.sleep(0.3)
            assert not waited
        thread.join(timeout=30)
        assert waited and waited[0] >= 0.25
        # A process holding is taken at once, and a candidate larger than the GPU goes when no
        # other candidate is held.
        with ledger.hold("process", 80), other.hold("candidate", 500):
            assert sorted(ledger.entries().values()) == [80, 500]
    finally:
        ledger.path.unlink(missing_ok=True)


def test_a_candidate_waits_for_room_the_ledger_does_not_know_of(tmp_path):
    """Memory held outside the ledger (another program, a process holding more than it
    declared) keeps a candidate waiting though the ledger has room, until the GPU frees it; a
    candidate alone beside process holdings goes, so nothing waits for good."""
    gpu = f"test-{tmp_path.name}"
    free = [20]
    ledger = DeviceLedger(gpu, 100, poll_s=0.01, free_bytes=lambda: free[0])
    other = DeviceLedger(gpu, 100, poll_s=0.01, free_bytes=lambda: free[0])
    taken: list[float] = []

    def take() -> None:
        began = time.monotonic()
        with other.hold("candidate", 40):
            taken.append(time.monotonic() - began)

    try:
        with ledger.hold("candidate", 10):
            thread = threading.Thread(target=take)
            thread.start()
            time.sleep(0.3)
            assert not taken, "40 bytes do not fit in the 20 the GPU has free"
            free[0] = 60
            thread.join(timeout=30)
        assert taken and taken[0] >= 0.25
        free[0] = 0
        with ledger.hold("process", 30), other.hold("candidate", 40):
            assert sorted(ledger.entries().values()) == [30, 40]
    finally:
        ledger.path.unlink(missing_ok=True)


def test_a_runs_own_steps_and_candidates_take_turns_in_the_ledger(tmp_path):
    gpu = f"test-{tmp_path.name}"
    ledger, other = DeviceLedger(gpu, 100, poll_s=0.01), DeviceLedger(gpu, 100, poll_s=0.01)
    order: list[str] = []

    def later(kind: str, needed: int) -> threading.Thread:
        def take() -> None:
            with other.hold(kind, needed):
                order.append(kind)

        thread = threading.Thread(target=take)
        thread.start()
        return thread

    try:
        # Another run profiles (a step of 70): a candidate of 60 waits for it, and the other
        # way round.
        with ledger.hold("step", 70):
            waiting = later("candidate", 60)
            time.sleep(0.3)
            assert order == []
            order.append("step")
        waiting.join(timeout=30)
        with ledger.hold("candidate", 70):
            waiting = later("step", 60)
            time.sleep(0.3)
            order.append("candidate")
        waiting.join(timeout=30)
        assert order == ["step", "candidate", "candidate", "step"]
        # A step larger than the GPU goes when no candidate or step is held, beside processes.
        with ledger.hold("process", 50), other.hold("step", 500):
            assert sorted(ledger.entries().values()) == [50, 500]
    finally:
        ledger.path.unlink(missing_ok=True)


def _until(found, what: str, timeout_s: float = 30.0):
    """`found()`'s first true value, polled; fails naming `what` after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while not (value := found()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)
    return value


def _waiting(ledger: DeviceLedger) -> dict[str, float]:
    """The ledger's waiting holdings and since when they wait ({} while it is being written)."""
    try:
        return json.loads(ledger.path.read_text()).get("waiting", {})
    except (FileNotFoundError, json.JSONDecodeError):
        return {}


def test_a_holding_kept_waiting_is_passed_by_no_later_one(tmp_path):
    # Each step waits for the ledger to show the one before it, so that a busy machine's
    # thread scheduling decides nothing.
    gpu = f"test-{tmp_path.name}"
    ledgers = [DeviceLedger(gpu, 100, poll_s=0.01, patience_s=0.2) for _ in range(3)]
    order: list[str] = []
    release = threading.Event()

    def take(ledger: DeviceLedger, name: str, needed: int, until: threading.Event | None
             ) -> threading.Thread:
        def run() -> None:
            with ledger.hold("candidate", needed):
                order.append(name)
                if until is not None:
                    until.wait(timeout=30)

        thread = threading.Thread(target=run)
        thread.start()
        return thread

    try:
        first = take(ledgers[0], "60 held", 60, release)
        _until(lambda: order, "the 60 to be held")
        large = take(ledgers[1], "70 waiting", 70, None)  # does not fit beside the 60
        began = min(_until(lambda: _waiting(ledgers[0]), "the 70 to wait").values())
        time.sleep(max(0.0, began + 0.3 - time.time()))  # ... and has waited past its patience
        # 35 fits beside the 60, but waits behind the 70; and beside the 70 it does not fit.
        small = take(ledgers[2], "35 later", 35, None)
        _until(lambda: len(_waiting(ledgers[0])) == 2, "the 35 to wait")
        assert order == ["60 held"]
        release.set()
        for thread in (first, large, small):
            thread.join(timeout=30)
        assert order == ["60 held", "70 waiting", "35 later"]
        assert json.loads(ledgers[0].path.read_text()) == {"held": {}, "waiting": {}}
    finally:
        release.set()
        ledgers[0].path.unlink(missing_ok=True)


def test_a_ledger_written_before_waiters_were_kept_still_reads(tmp_path):
    ledger = DeviceLedger(f"test-{tmp_path.name}", 100, poll_s=0.01)
    ledger.path.write_text(json.dumps({f"{os.getpid()}:process:1": 40}))
    try:
        with ledger.hold("candidate", 50):
            assert sorted(ledger.entries().values()) == [40, 50]
    finally:
        ledger.path.unlink(missing_ok=True)


class _Side:
    def __init__(self) -> None:
        self.forgotten: list[int] = []

    def forget(self, shared: SharedInput) -> None:
        self.forgotten.append(shared.number)


class _Candidate:
    """The judge's view of a candidate's process, standing in for one: it sums its input."""

    device = torch.device("cpu")

    def __init__(self) -> None:
        self.side, self.released = _Side(), 0

    def call(self, copies: list[object], deadline: float) -> CallResult:
        return CallResult(copies[0].tensor.sum(), 1.0, 1, [], [], [])

    def release(self, deadline: float) -> None:
        self.released += 1


def test_a_trial_on_reused_copies_lets_go_of_them_before_its_reference_runs():
    """The third trial refills the second's copies; they must be gone from the second trial's
    list too by the time the reference's temporaries come on top of the inputs."""
    reused = [SharedInput(7, torch.zeros(64), None)]
    held_at_reference: list[int] = []

    def reference(x: torch.Tensor) -> torch.Tensor:
        held_at_reference.append(len(reused))
        return x.sum()

    models = Models(reference, _Candidate())
    trial = run_trial(models, "reused", lambda: [torch.ones(64)], torch.device("cpu"), set(),
                      EvalConfig(device="cpu"), deadline=float("inf"), reuse=reused)
    assert trial.comparison.mismatch is None
    assert held_at_reference == [0], "the reused copies were alive while the reference ran"
    assert models.candidate.side.forgotten == [7] and models.candidate.released == 1
