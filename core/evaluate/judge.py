"""Judge one candidate against one problem inside the current (worker) process.

Order of work: import the candidate, build `Model` and `ModelNew` seeded alike, then for every
seed and the captured inputs run the candidate first (poisoned, guarded allocations, fresh input
copies) and the reference second, and compare; the second trial hands the candidate the first
trial's input buffers holding new values, to catch results cached by pointer; time candidate and
reference alike; re-verify a speedup above the threshold; check once more on unseen inputs after
timing.

Memory stays within a few times the problem's inputs and outputs, whatever their size: inputs are
drawn on the device for each trial and dropped after it (`core.evaluate.trial` says what a trial
holds), and timing rotates copies only while they fit twice in L2. `Verdict.peak_memory_bytes`
says what a candidate took, and `Verdict.phase_seconds` where its time went.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path

import torch

from core.evaluate.config import EvalConfig
from core.evaluate.correctness import Comparison
from core.evaluate.counters import collect
from core.evaluate.diagnosis import diagnose
from core.evaluate.kernel_report import candidate_report
from core.evaluate.trial import (
    Models,
    Rejected,
    Trial,
    build_models,
    classify,
    judge_failure,
    run_trial,
)
from core.evaluate.verdict import Reason, Verdict
from core.runtime.problem_loader import (
    Problem,
    import_file,
    load_problem,
    on_device,
    write_candidate,
)
from core.timing.device_lock import DeviceLock
from core.timing.model_timing import rotation_sets, time_model
from core.timing.timer import TimingStats

REVERIFY_SEED_OFFSET = 1000


class Judge:
    """Judges candidates in this process, keeping the last problem loaded."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.problem_key: tuple[str, int] | None = None
        self.problem: Problem | None = None
        self.lock = DeviceLock(None)
        self.holds = ExitStack()

    def load(self, path: str, device: torch.device) -> Problem:
        resolved = Path(path).resolve()
        key = (str(resolved), resolved.stat().st_mtime_ns)
        if key != self.problem_key or self.problem is None:
            self.problem, self.problem_key = load_problem(resolved), key
        return self.problem

    def pristine(self, seed: int | None, device: torch.device) -> list[object]:
        """A trial's inputs, new for each trial: drawn on the device from `seed`, or the
        captured inputs (`seed` None) moved there."""
        assert self.problem is not None
        if seed is None:
            return on_device(list(self.problem.captured_inputs or []), device)
        return self.problem.inputs(seed, device)

    def judge(self, problem_path: str, source: str, config: EvalConfig, anchors: set[str],
              on_phase: Callable[[str], None]) -> tuple[Verdict, bool]:
        """The verdict, and whether this process is still fit to judge the next candidate."""
        device = torch.device(config.device)
        problem = self.load(problem_path, device)
        candidate_path, module_name = write_candidate(source, self.workdir)
        verdict = Verdict(timing_device=timing_label(device))
        self.lock, self.holds = DeviceLock(config.gpu_lock), ExitStack()
        clock = PhaseClock(verdict)
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        try:
            with self.holds:
                self.run_checks(verdict, problem, candidate_path, module_name, config,
                                anchors, on_phase, clock)
        except Rejected as rejection:
            verdict.reason_code, verdict.reason = rejection.code, rejection.reason
            verdict.compile_log = rejection.log
            verdict.compiled = verdict.compiled and rejection.compiled
            verdict.correct = verdict.accepted = False
            return verdict, rejection.healthy and context_healthy(device)
        finally:
            clock.stop()
            if device.type == "cuda":
                verdict.peak_memory_bytes = torch.cuda.max_memory_allocated(device)
        not_faster = slower_reason(verdict, config.time)
        if not_faster is None:
            verdict.accepted = True
        else:
            verdict.reason_code, verdict.reason = not_faster
        return verdict, True

    def run_checks(self, verdict: Verdict, problem: Problem, candidate_path: Path,
                   module_name: str, config: EvalConfig, anchors: set[str],
                   on_phase: Callable[[str], None], clock: PhaseClock) -> None:
        device = torch.device(config.device)
        clock.start("compile")
        try:
            module = import_file(candidate_path, module_name)
            if not hasattr(module, "ModelNew"):
                raise Rejected(Reason.NO_MODEL_NEW, "the candidate defines no ModelNew",
                               compiled=False)
            models = build_models(problem, module.ModelNew, config.seeds[0], device)
        except Rejected:
            raise
        except Exception as err:
            rejection = classify(err, candidate_path)
            if rejection.code is Reason.RUNTIME_ERROR:
                rejection.code, rejection.compiled = Reason.INIT_ERROR, False
            raise rejection from err
        verdict.compiled = True
        labels: list[tuple[str, int | None]] = [(f"seed {s}", s) for s in config.seeds]
        if problem.captured_inputs is not None:
            labels.append(("captured", None))
        trials: list[Trial] = []
        # One trial calls the candidate on the first trial's input buffers, holding new
        # values: a result cached by pointer comes back wrong. The third, so that the second,
        # on fresh buffers, tells a result cached by shape from one cached by pointer.
        reuse_at = min(2, len(labels) - 1)
        with torch.no_grad():
            for label, seed in labels:
                reused = trials[0] if len(trials) == reuse_at else None
                trial = self.checked_trial(models, label, seed, device, config, anchors,
                                           candidate_path, previous=trials, reused=reused,
                                           keep=not trials)
                if reused is not None:
                    reused.buffers = None
                if not trials:
                    on_phase("compiled")
                    clock.start("checks")
                    # The first trial compiled the candidate (seconds of CPU work) without the
                    # device lock; from here on its kernels only run: they share the device with
                    # other checks, never with a timing.
                    self.holds.enter_context(self.lock.shared())
                trials.append(trial)
                verdict.trials_checked.append(label)
                record_errors(verdict, trial.comparison)
        verdict.correct = True
        report = candidate_report(module, candidate_path.read_text())
        verdict.kernel_report = report.to_dict()
        verdict.library_ops = sorted(models.library_ops)
        verdict.kernel_launches = models.launches
        name, tol = next(iter(models.tolerances.values()), ("exact", 0.0))
        verdict.tolerance_name, verdict.tolerance = name, tol
        if config.time:
            clock.start("timing")
            self.timed(verdict, models, device, config)
        if verdict.speedup is not None and verdict.speedup > config.reverify_above:
            clock.start("checks")
            self.reverify(verdict, models, device, config, anchors, candidate_path)
        # Latencies measured on the CPU say nothing about a GPU's byte floor.
        gpu_latency = verdict.latency_ms if device.type == "cuda" else None
        counters = None
        if config.counters:
            clock.start("counters")
            # The profiled program takes the device lock itself, alone, around the forward
            # that ncu replays: those kernels must not overlap anyone's, nor anyone's them.
            with self.lock.released():
                counters = collect(problem.path, candidate_path, config.seeds[0],
                                   config.counters_timeout_s, device.type, config.gpu_lock)
            verdict.counters = counters.to_dict()
        verdict.diagnosis = str(diagnose(report, gpu_latency, trials[0].floor_ms,
                                         verdict.baseline_ms, counters))
        clock.start("checks")
        after_seed = max(config.seeds) + 1
        try:
            with torch.no_grad():
                self.checked_trial(models, f"seed {after_seed} after timing", after_seed, device,
                                   config, anchors, candidate_path, previous=[])
        except Rejected as rejection:
            if rejection.code in (Reason.CUDA_ERROR, Reason.OUT_OF_MEMORY, Reason.RUNTIME_ERROR):
                raise
            raise Rejected(Reason.WRONG_AFTER_TIMING,
                           f"correct at first, wrong after being timed: {rejection.reason}"
                           ) from rejection
        verdict.trials_checked.append(f"seed {after_seed} after timing")

    def checked_trial(self, models: Models, label: str, seed: int | None, device: torch.device,
                      config: EvalConfig, anchors: set[str], candidate_path: Path,
                      previous: list[Trial], reused: Trial | None = None,
                      keep: bool = False) -> Trial:
        """One trial; `keep`: its input buffers stay with it, for the next trial to reuse."""
        try:
            pristine = self.pristine(seed, device)
        except Exception as err:
            raise judge_failure(err, "drawing the problem's inputs") from err
        try:
            trial = run_trial(models, label, pristine, device, anchors, config,
                              None if reused is None else reused.buffers, keep=keep)
        except Rejected:
            raise
        except Exception as err:
            raise classify(err, candidate_path) from err
        mismatch = trial.comparison.mismatch
        if mismatch:
            if reused is not None and trial.fingerprint == reused.fingerprint:
                raise Rejected(Reason.CACHED_RESULT,
                               "called again on the same input buffers holding new values, it "
                               "returned the previous result: results are cached by pointer")
            for earlier in previous:
                if trial.fingerprint == earlier.fingerprint:
                    raise Rejected(Reason.CACHED_RESULT,
                                   f"{label}: returned the same output as for {earlier.label}, "
                                   f"whose inputs differ: results are cached across calls")
            raise Rejected(mismatch.code, f"{label}: {mismatch.message}")
        return trial

    def timed(self, verdict: Verdict, models: Models, device: torch.device,
              config: EvalConfig) -> None:
        """Candidate, then reference, on the same input sets: the candidate was just shown to
        leave its inputs alone, and what the reference does to them after does not matter."""
        try:
            input_sets = rotation_sets(self.pristine(config.seeds[0], device), device,
                                       config.rotation_budget_bytes)
        except Exception as err:
            raise judge_failure(err, "making the timing's input copies") from err
        with self.lock.exclusive():
            cand = time_model(models.candidate, input_sets, device, config.warmup_count,
                              config.trial_count, config.warmup_time_ms)
            base = time_model(models.reference, input_sets, device, config.warmup_count,
                              config.trial_count, config.warmup_time_ms)
        record_timing(verdict, cand, base)

    def reverify(self, verdict: Verdict, models: Models, device: torch.device,
                 config: EvalConfig, anchors: set[str], candidate_path: Path) -> None:
        first = verdict.speedup or 0.0
        with torch.no_grad():
            for seed in config.seeds:
                fresh = seed + REVERIFY_SEED_OFFSET
                self.checked_trial(models, f"seed {fresh} (re-verification)", fresh, device,
                                   config, anchors, candidate_path, previous=[])
                verdict.trials_checked.append(f"seed {fresh} (re-verification)")
        self.timed(verdict, models, device, config)
        second = verdict.speedup or 0.0
        verdict.flagged = True
        if second < first / 2:
            raise Rejected(Reason.SPEEDUP_NOT_REPRODUCED,
                           f"measured {first:.1f}x, then {second:.1f}x when timed again")


def slower_reason(verdict: Verdict, timed: bool) -> tuple[Reason, str] | None:
    """Why a correct candidate is not accepted: not faster than the reference, or not timed."""
    if not timed:
        return Reason.NOT_TIMED, "correct; not timed, so not known to be faster"
    if verdict.speedup is not None and verdict.speedup > 1.0:
        return None
    return Reason.SLOWER, (f"correct, but {verdict.speedup or 0.0:.2f}x the speed of the PyTorch "
                           f"reference ({verdict.latency_ms:.4g} ms against "
                           f"{verdict.baseline_ms:.4g} ms)")


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

