"""Time spent waiting for the device lock (another process timing, or checking while this one
would time) is a phase of its own, not part of the checks or the timing it interrupted."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from core.evaluate import EvalConfig, Evaluator
from core.evaluate.judge_timing import DEVICE_WAIT, PhaseClock
from core.evaluate.verdict import Verdict
from core.timing.device_lock import DeviceLock
from store import PHASES

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "tests" / "data" / "evaluate"
HOLD_S = 2.0


def test_a_wait_moves_out_of_the_phase_it_interrupted():
    verdict = Verdict()
    clock = PhaseClock(verdict)
    clock.start("checks")
    time.sleep(0.05)
    clock.waited(0.03)
    clock.stop()
    assert verdict.phase_seconds[DEVICE_WAIT] == 0.03
    assert 0.015 < verdict.phase_seconds["checks"] < 0.05
    clock.waited(1.0)  # between phases: nothing to take it from
    assert verdict.phase_seconds[DEVICE_WAIT] == 0.03


def test_the_lock_tells_how_long_it_waited(tmp_path):
    path = str(tmp_path / "gpu-0.lock")
    waits: list[float] = []
    with DeviceLock(path, waits.append).shared():
        pass
    assert len(waits) == 1 and waits[0] < 0.5


def test_a_verdict_judged_behind_another_timing_counts_the_wait_apart(tmp_path):
    path = str(tmp_path / "gpu-0.lock")
    held = tmp_path / "held"
    hold = ("import sys, time, pathlib\nfrom core.timing.device_lock import exclusive_device\n"
            "with exclusive_device(sys.argv[1]):\n"
            "    pathlib.Path(sys.argv[2]).touch()\n    time.sleep(float(sys.argv[3]))\n")
    problem, source = DATA / "pointwise_problem.py", (DATA / "good_pointwise.py").read_text()
    with Evaluator(EvalConfig(device="cpu", gpu_lock=path), workers=1) as evaluator:
        evaluator.evaluate(problem, source)  # the worker started, before the other holds
        other = subprocess.Popen([sys.executable, "-c", hold, path, str(held), str(HOLD_S)],
                                 cwd=ROOT)
        try:
            while not held.exists():
                time.sleep(0.02)
            verdict = evaluator.evaluate(problem, source)
        finally:
            other.wait(timeout=60)
    assert verdict.correct, verdict.reason
    waited = verdict.phase_seconds.get(DEVICE_WAIT, 0.0)
    assert waited > HOLD_S / 2, verdict.phase_seconds
    assert verdict.phase_seconds["checks"] < HOLD_S / 2, verdict.phase_seconds
    assert DEVICE_WAIT in PHASES  # the store and the app know the phase
