"""The judge's timing of a candidate and its reference, and the verdict's bookkeeping around it.

The candidate is timed by the path its checks took: the same kind of guarded input copies, the
same guard, its process timing each call between the timer's marks (L2 flushed before it). The
judge sends the calls one by one, rotating through input sets, and checks every call's guard
bands, launches and output types, and the outputs and inputs of every warm-up call and of
trials the judge draws at random and keeps to itself, as a trial would: a candidate cannot tell a
timed call from a checked one, nor be wrong only when timed, and the median it is judged by
moves only with over half the trials. The reference is timed here by
`core.timing.model_timing`, on its own copies of the same sets, while the judge holds the
device alone.
"""

from __future__ import annotations

import os
import random
import statistics
import time
from collections.abc import Callable

import torch

from core.evaluate.candidate import Rejected
from core.evaluate.config import CHECKED_TRIALS, MIN_TRIALS, EvalConfig
from core.evaluate.correctness import (
    Comparison,
    changed_inputs,
    compare_outputs,
    reference_scales,
)
from core.evaluate.exact_reference import (
    ExactAnswer,
    as_close_as_pytorch,
    exact_answer,
    no_room_for_exact,
)
from core.evaluate.trial import (
    Models,
    checked_call,
    forget_copies,
    judge_failure,
    shared_copies,
    tensors_of,
)
from core.evaluate.verdict import Reason, Verdict
from core.timing.device_lock import DeviceLock
from core.timing.model_timing import rotation_sets, time_model
from core.timing.timer import TimingStats


def time_candidate(models: Models, candidate_sets: list[list[object]],
                   plain_sets: list[list[object]], references: list[object],
                   config: EvalConfig, anchors: set[str], deadline: float
                   ) -> tuple[TimingStats, bool]:
    """Warm-up calls (a count, and a wall-clock minimum), then the timed trials; each warm-up
    call's inputs and output checked against its set's, and those of CHECKED_TRIALS trials drawn
    at random (`spot_checks`). Also whether it was timed briefly, as a clear loser
    (`EvalConfig.losing`): MIN_TRIALS trials, unless those do not lose after all."""
    calls = 0
    exact: dict[int, ExactAnswer] = {}  # each set's, for outputs that are noise
    scales = [reference_scales(reference) for reference in references]  # read once, not a call

    def failure(outputs: object, index: int) -> str | None:
        """Why a call's outputs fail, as the checks would fail them (against fp64 too, for
        outputs that passed only so); None when they pass."""
        compared = compare_outputs(outputs, references[index], models.tolerances, scales[index])
        if compared.mismatch is None:
            return None
        if models.against_exact:
            if index not in exact:
                no_room = no_room_for_exact(models.reference, plain_sets[index],
                                            references[index], models.candidate.device)
                if no_room is not None:
                    return f"{compared.mismatch.message} (no fp64 second opinion: {no_room})"
                exact[index] = exact_answer(models.reference, plain_sets[index])
            if as_close_as_pytorch(outputs, references[index], exact[index],
                                   models.tolerances) is not None:
                return None
        return compared.mismatch.message

    def call(check: bool = True) -> float:
        """One call; `check`: its outputs and inputs compared too (its guard bands, launches
        and output types always are)."""
        nonlocal calls
        index = calls % len(candidate_sets)
        calls += 1
        label = f"timed call {calls}"
        result = checked_call(models, label, candidate_sets[index], deadline, anchors)
        if not check:
            return result.milliseconds
        mutated = changed_inputs(plain_sets[index], tensors_of(candidate_sets[index]))
        if mutated:
            raise Rejected(mutated.code, f"{label}: {mutated.message}")
        why = failure(result.outputs, index)
        if why is not None:
            raise Rejected(Reason.WRONG_AFTER_TIMING, f"correct at first, wrong while being "
                                                      f"timed ({label}): {why}")
        return result.milliseconds

    began, warm = time.perf_counter(), []
    while calls < config.warmup_after_checks or (time.perf_counter() - began) * 1e3 < \
            config.warmup_time_ms:
        warm.append(call())
    def trials(first: int, last: int) -> list[float]:
        checked = {first + trial for trial in spot_checks(last - first)}
        return [call(trial in checked) for trial in range(first, last)]

    samples, brief = raced_trials(config, warm, trials)
    return TimingStats.from_samples(samples, models.candidate.device.type), brief


def raced_trials(config: EvalConfig, warm: list[float],
                 trials: Callable[[int, int], list[float]]) -> tuple[list[float], bool]:
    """The timed trials' times, from `trials(first, last)`, and whether they were brief: a
    candidate whose warm-up calls lose the race (`EvalConfig.losing`) gets MIN_TRIALS, then the
    full count after all if those do not lose."""
    count = config.trials_within(statistics.median(warm)) if warm else config.trial_count
    if not warm or not config.losing(statistics.median(warm)):
        return trials(0, count), False
    samples = trials(0, min(count, MIN_TRIALS))
    if config.losing(statistics.median(samples)):
        return samples, True
    return samples + trials(len(samples), count), False  # slow to warm, not slow


def spot_checks(trials: int) -> set[int]:
    """The timed trials whose outputs and inputs are checked: CHECKED_TRIALS of them drawn at
    random from the system's entropy (all of them when there are no more)."""
    return set(random.SystemRandom().sample(range(trials), min(trials, CHECKED_TRIALS)))


def forget_sets(models: Models, sets: list[list[object]]) -> None:
    for copies in sets:
        forget_copies(models, copies)


def time_both(verdict: Verdict, models: Models, draw: Callable[[], list[object]],
              device: torch.device, config: EvalConfig, anchors: set[str], deadline: float,
              lock: DeviceLock) -> None:
    """Candidate, then reference, on the same input sets (each on copies of its own); `draw()`
    gives the timing's inputs, the same values at every call."""
    try:
        # The sets hold the same values, so one reference output serves them all. It is made
        # first, on a draw of its own that it may change in place, so that its temporaries come
        # on top of one set of inputs, with no clone beside it.
        references = [models.reference(*draw())]
        plain_sets = rotation_sets(draw(), device, config.rotation_budget_bytes)
        references *= len(plain_sets)
        candidate_sets = [shared_copies(models, s, deadline) for s in plain_sets]
    except Rejected:
        raise
    except Exception as err:
        raise judge_failure(err, "making the timing's input copies") from err
    with lock.exclusive():
        candidate, brief = time_candidate(models, candidate_sets, plain_sets, references,
                                          config, anchors, deadline)
        # The candidate's copies, and the outputs its timed calls were checked against, are
        # freed before the reference is timed (its own outputs come on top of its inputs): no
        # name here may keep one alive.
        forget_sets(models, candidate_sets)
        candidate_sets.clear()
        references.clear()
        models.candidate.release(deadline)
        # A warm-up of calls alone: the GPU has just been busy with the candidate's, for at
        # least its warm-up time, so its clocks are up.
        baseline = time_model(
            models.reference, plain_sets, device, config.warmup_after_checks,
            config.trial_count, queue_ahead=True,
            trials_within=(lambda ms: min(MIN_TRIALS, config.trials_within(ms))) if brief
            else config.trials_within)
    record_timing(verdict, candidate, baseline)


def below_floor(verdict: Verdict, impossible_ms: float, config: EvalConfig) -> str:
    """Why a timing is impossible (faster than its bytes can move), or '' when it is not."""
    if verdict.latency_ms is None or verdict.latency_ms >= impossible_ms:
        return ""
    return (f"timed at {verdict.latency_ms:.4g} ms, under the byte floor of {impossible_ms:.4g} "
            f"ms (its inputs read once at {config.peaks.read_bandwidth / 1e12:g} TB/s, and "
            "what it writes beyond the L2): impossible, so the timing is not to be trusted")


def slower_reason(verdict: Verdict, timed: bool) -> tuple[Reason, str] | None:
    """Why a correct candidate is not accepted: not faster than the reference, or not timed."""
    if not timed:
        return Reason.NOT_TIMED, "correct; not timed, so not known to be faster"
    if verdict.speedup is not None and verdict.speedup > 1.0:
        return None
    return Reason.SLOWER, (f"correct, but {verdict.speedup or 0.0:.2f}x the speed of the PyTorch "
                           f"reference ({verdict.latency_ms:.4g} ms against "
                           f"{verdict.baseline_ms:.4g} ms)")


DEVICE_WAIT = "waiting for the device"


class PhaseClock:
    """Seconds of a verdict's judging spent in each phase (compile, checks, timing, counters),
    written into `verdict.phase_seconds` as the phases change."""

    def __init__(self, verdict: Verdict) -> None:
        self.verdict = verdict
        self.phase: str | None = None
        self.since = time.perf_counter()

    def start(self, phase: str | None) -> None:
        now = time.perf_counter()
        if self.phase is not None:
            spent = self.verdict.phase_seconds.get(self.phase, 0.0) + now - self.since
            self.verdict.phase_seconds[self.phase] = spent
        self.phase, self.since = phase, now

    def stop(self) -> None:
        self.start(None)

    def waited(self, seconds: float) -> None:
        """`seconds` of the current phase went to waiting for the device lock (another
        process's timing, or its checks): counted apart, so that a phase's time is its own."""
        if self.phase is None or seconds <= 0:
            return
        self.since += seconds
        phases = self.verdict.phase_seconds
        phases[DEVICE_WAIT] = phases.get(DEVICE_WAIT, 0.0) + seconds


def record_errors(verdict: Verdict, comparison: Comparison) -> None:
    verdict.max_abs_err = max(verdict.max_abs_err or 0.0, comparison.max_abs_err)
    verdict.max_rel_err = max(verdict.max_rel_err or 0.0, comparison.max_rel_err)


def record_timing(verdict: Verdict, candidate: TimingStats, baseline: TimingStats) -> None:
    verdict.latency_ms = candidate.median_ms
    verdict.latency_mean_ms = candidate.mean_ms
    verdict.latency_min_ms = candidate.min_ms
    verdict.latency_max_ms = candidate.max_ms
    verdict.latency_stdev_ms = candidate.stdev_ms
    verdict.timing_trials = candidate.trials
    verdict.baseline_ms = baseline.median_ms
    verdict.speedup = baseline.median_ms / candidate.median_ms if candidate.median_ms else None


def timing_label(device: torch.device) -> str:
    if device.type == "cuda":
        return f"cuda ({torch.cuda.get_device_name(device)})"
    interpreted = os.environ.get("TRITON_INTERPRET") == "1"
    return "cpu (Triton interpreter)" if interpreted else "cpu"


def context_healthy(device: torch.device) -> bool:
    """After a CUDA error the context may be poisoned for good: probe it with a sync."""
    if device.type != "cuda":
        return True
    try:
        torch.cuda.synchronize(device)
        torch.ones(1, device=device).add_(1).item()
    except RuntimeError:
        return False
    return True
