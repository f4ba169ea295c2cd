"""Judge one candidate against one problem: the trusted side, which never runs candidate code.

The candidate runs in a process of its own (`core.evaluate.candidate`, fresh from the zygote for
each candidate, sandboxed), which hands back only output tensors and timings. Here the judge
draws the inputs (from a seed drawn for this evaluation), runs the reference, compares, times
and makes the verdict. Order of work: build `ModelNew` there and `Model` here after the same
seed; for every seed and the captured inputs run the candidate (poisoned, guarded allocations,
fresh input copies) and the reference, on inputs drawn alike, and compare; the third trial hands
the candidate the second trial's input buffers holding new values, to catch results cached by
pointer; time candidate (by the same path as the checks, each timed call's output checked) and
reference; reject a time under the byte floor; re-verify a speedup above the threshold; check once
more on unseen inputs after timing.

Memory stays within a few times the problem's inputs and outputs, whatever their size
(`core.evaluate.trial` says what a trial holds). `Verdict.peak_memory_bytes` says what a
candidate took, and `Verdict.phase_seconds` where its time went.
"""

from __future__ import annotations

import secrets
import shutil
import time
import traceback
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, suppress
from pathlib import Path

import torch

from core.evaluate.candidate import CandidateProcess, Rejected
from core.evaluate.config import EvalConfig
from core.evaluate.counters import collect
from core.evaluate.diagnosis import diagnose
from core.evaluate.judge_timing import (
    PhaseClock,
    below_floor,
    context_healthy,
    record_errors,
    slower_reason,
    time_both,
    timing_label,
)
from core.evaluate.kernel_report import KernelReport, cuda_sources_report, with_cuda_report
from core.evaluate.launchers import LauncherFolder
from core.evaluate.memory import ProblemBytes, candidate_limits, problem_bytes
from core.evaluate.transport import PAGE
from core.evaluate.trial import Models, Trial, judge_failure, run_trial
from core.evaluate.verdict import Reason, Verdict
from core.evaluate.zygote import Zygote
from core.runtime.problem_loader import (
    Problem,
    load_problem,
    on_device,
    seed_device,
    write_candidate,
)
from core.timing.device_lock import DeviceLock
from core.timing.precision import fp32_matmuls

REVERIFY_SEED_OFFSET = 1000
LOADED_PROBLEMS = 8  # kept loaded (their modules and byte counts, no device memory)


class LoadedProblems:
    """The last `LOADED_PROBLEMS` problems loaded, with their byte counts, by path and
    modification time: a changed file is loaded again."""

    def __init__(self) -> None:
        self.loaded: OrderedDict[tuple[str, int], tuple[Problem, ProblemBytes]] = OrderedDict()

    def get(self, path: Path, key: tuple[str, int]) -> tuple[Problem, ProblemBytes]:
        if key not in self.loaded:
            self.loaded[key] = (load_problem(path), problem_bytes(path))
            while len(self.loaded) > LOADED_PROBLEMS:
                self.loaded.popitem(last=False)
        self.loaded.move_to_end(key)
        return self.loaded[key]


class Judge:
    """Judges candidates, keeping the last few problems loaded (a search's steps alternate
    between sites) and the last one's reference models."""

    def __init__(self, workdir: Path, zygote: Zygote, log_path: Path) -> None:
        self.workdir, self.zygote, self.log_path = workdir, zygote, log_path
        self.problem_key: tuple[str, int] | None = None
        self.problem: Problem | None = None
        self.sizes: ProblemBytes | None = None
        self.loaded = LoadedProblems()
        self.references: dict[tuple[int, str], torch.nn.Module] = {}
        self.lock = DeviceLock(None)
        self.holds = ExitStack()
        self.count = 0
        self.held_for_the_dead = False
        self.launchers = LauncherFolder(zygote.launchers) if zygote.launchers else None
        self.reports = ThreadPoolExecutor(1, thread_name_prefix="kiln-cuda-report")

    @classmethod
    def start(cls, folder: Path, device: str) -> Judge:
        """A judge working in `folder`, its zygote forked now (before this process touches
        CUDA: candidates' processes start it afresh) with, on CUDA, the folder of Triton
        launchers its candidates' processes read."""
        zygote = Zygote(device, launchers=folder / "launchers" if device == "cuda" else None)
        return cls(folder, zygote, folder / "stderr.log")

    def load(self, path: str) -> Problem:
        resolved = Path(path).resolve()
        key = (str(resolved), resolved.stat().st_mtime_ns)
        if key != self.problem_key or self.problem is None:
            (self.problem, self.sizes), self.problem_key = self.loaded.get(resolved, key), key
            self.references = {}  # device memory: the current problem's only
        return self.problem

    def reference(self, seed: int, device: torch.device) -> torch.nn.Module:
        """The problem's `Model`, built after `seed` as KernelBench does (and as `ModelNew` is
        built in the candidate's process, so that parameters agree)."""
        assert self.problem is not None
        key = (seed, str(device))
        if key not in self.references:
            init = self.problem.init_inputs()
            seed_device(seed, device)
            self.references[key] = self.problem.model_class(*init).to(device).eval()
        return self.references[key]

    def pristine(self, seed: int | None, device: torch.device) -> list[object]:
        """A trial's inputs, new for each trial: drawn on the device from `seed`, or the
        captured inputs (`seed` None) moved there."""
        assert self.problem is not None
        try:
            if seed is None:
                return on_device(list(self.problem.captured_inputs or []), device)
            return self.problem.inputs(seed, device)
        except Exception as err:
            raise judge_failure(err, "drawing the problem's inputs") from err

    def judge(self, problem_path: str, source: str, config: EvalConfig, anchors: set[str],
              on_phase: Callable[[str], None]) -> tuple[Verdict, bool]:
        """The verdict, and whether this process is still fit to judge the next candidate: not
        when the candidate's process ended holding memory of this one's."""
        verdict, healthy = self._judge(problem_path, source, config, anchors, on_phase)
        return verdict, healthy and not self.held_for_the_dead

    def _judge(self, problem_path: str, source: str, config: EvalConfig, anchors: set[str],
               on_phase: Callable[[str], None]) -> tuple[Verdict, bool]:
        device = torch.device(config.device)
        problem = self.load(problem_path)
        self.count += 1
        scratch = self.workdir / f"candidate-{self.count}"
        scratch.mkdir()
        candidate_path, module_name = write_candidate(source, scratch)
        verdict = Verdict(timing_device=timing_label(device))
        clock = PhaseClock(verdict)
        self.lock, self.holds = DeviceLock(config.gpu_lock, clock.waited), ExitStack()
        process: CandidateProcess | None = None
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        try:
            with self.holds:
                assert self.sizes is not None
                self.holds.enter_context(fp32_matmuls(config.allow_tf32))  # the reference's
                clock.start("candidate start")
                process = CandidateProcess(self.zygote, scratch, device,
                                           candidate_limits(config, self.sizes), self.log_path)
                models = Models(self.reference(config.seeds[0], device), process)
                self.run_checks(verdict, problem, models, candidate_path, module_name, source,
                                config, anchors, on_phase, clock)
        except Rejected as rejection:
            verdict.reason_code, verdict.reason = rejection.code, rejection.reason
            verdict.compile_log = rejection.log
            verdict.compiled = verdict.compiled and rejection.compiled
            verdict.crashed, verdict.timed_out = rejection.crashed, rejection.timed_out
            verdict.correct = verdict.accepted = False
            return verdict, rejection.healthy and context_healthy(device)
        except Exception as err:  # the judge's own failure is this candidate's verdict
            failure = judge_failure(err, "judging this candidate")
            verdict.reason_code, verdict.reason = failure.code, failure.reason
            verdict.correct = False
            verdict.compile_log = traceback.format_exc()
            return verdict, False
        finally:
            if process is not None:
                clock.start("ending")
                self.finish(verdict, process, device)
            clock.stop()
            shutil.rmtree(scratch, ignore_errors=True)
        not_faster = slower_reason(verdict, config.time)
        if not_faster is None:
            verdict.accepted = True
        else:
            verdict.reason_code, verdict.reason = not_faster
        return verdict, True

    def finish(self, verdict: Verdict, process: CandidateProcess, device: torch.device) -> None:
        """The candidate's process ends, holding none of the judge's memory (else this judge
        is not fit to go on: `held_for_the_dead`); on CUDA the verdict's peak is the judge's
        and its."""
        peak, launchers = None, None
        if verdict.reason_code is Reason.CUDA_ERROR:
            process.kill()  # its context is unusable: it could answer nothing more
        if device.type == "cuda":
            peak = torch.cuda.max_memory_allocated(device)
            if not process.ended:
                with suppress(Rejected):
                    own_peak, launchers = process.stats(time.monotonic() + 10)
                    peak += own_peak or 0
        verdict.peak_memory_bytes = peak
        self.held_for_the_dead = not process.let_go_of_everything(time.monotonic() + 10)
        process.close()
        if self.launchers is not None and launchers:
            self.launchers.build(launchers)

    def run_checks(self, verdict: Verdict, problem: Problem, models: Models, candidate_path: Path,
                   module_name: str, source: str, config: EvalConfig, anchors: set[str],
                   on_phase: Callable[[str], None], clock: PhaseClock) -> None:
        device = torch.device(config.device)
        base = config.input_seed if config.input_seed is not None else secrets.randbelow(1 << 31)
        # The CUDA sources' figures come from nvcc run again here: started now, it runs while
        # the candidate's process builds and its trials are checked, not after them.
        cuda_report = self.reports.submit(cuda_sources_report, source)
        clock.start("compile")
        deadline = time.monotonic() + config.compile_timeout_s
        models.candidate.build(candidate_path, module_name, problem.init_inputs(),
                               config.seeds[0], config.tf32_for(anchors), deadline)
        verdict.compiled = True
        labels: list[tuple[str, int | None]] = [(f"seed {base + s}", base + s)
                                                for s in config.seeds]
        if problem.captured_inputs is not None:
            labels.append(("captured", None))
        trials: list[Trial] = []
        # One trial calls the candidate on the previous trial's input buffers, holding new
        # values: a result cached by pointer comes back wrong. The third, so that the second,
        # on fresh buffers, tells a result cached by shape from one cached by pointer: its
        # copies lie a page further into their buffers than the first's, at other addresses
        # even where the allocator hands back the first's memory (`core.evaluate.trial` says
        # what each trial holds).
        reuse_at = min(2, len(labels) - 1)
        with torch.no_grad():
            for label, seed in labels:
                reused = trials[-1] if trials and len(trials) == reuse_at else None
                lead = PAGE if len(trials) == 1 and reused is None else 0
                trial = self.checked_trial(models, label, seed, device, config, anchors,
                                           deadline, previous=trials, reused=reused,
                                           keep=len(trials) == reuse_at - 1, lead=lead)
                if reused is not None:
                    reused.copies = None
                if not trials:
                    on_phase("compiled")
                    models.candidate.phase = "run"
                    deadline = time.monotonic() + config.run_timeout_s
                    clock.start("checks")
                    # The first trial compiled the candidate (seconds of CPU work) without the
                    # device lock; from here on its kernels only run: they share the device with
                    # other checks, never with a timing.
                    self.holds.enter_context(self.lock.shared())
                trials.append(trial)
                verdict.trials_checked.append(label)
                record_errors(verdict, trial.comparison)
        for trial in trials:
            trial.copies = None
        verdict.correct = True
        report = with_cuda_report(
            KernelReport.from_dict(models.candidate.kernel_report(deadline)), cuda_report.result())
        verdict.kernel_report = report.to_dict()
        verdict.library_ops = sorted(models.library_ops)
        verdict.kernel_launches = models.launches
        name, tol = next(iter(models.tolerances.values()), ("exact", 0.0))
        if models.against_exact:
            name += ", or as close to the fp64 answer as PyTorch's"
        verdict.tolerance_name, verdict.tolerance = name, tol
        timing_seed = base + config.seeds[0]
        if config.time:
            clock.start("timing")
            self.timed(verdict, models, timing_seed, device, config, anchors, deadline)
            impossible = below_floor(verdict, trials[0].impossible_ms, config)
            if config.floor_applies and impossible:
                verdict.flagged = True
                raise Rejected(Reason.BELOW_FLOOR, impossible)
        if verdict.speedup is not None and verdict.speedup > config.reverify_above:
            clock.start("checks")
            self.reverify(verdict, models, base, timing_seed, device, config, anchors,
                          deadline)
        # Latencies measured on the CPU say nothing about a GPU's byte floor.
        gpu_latency = verdict.latency_ms if device.type == "cuda" else None
        counters = None
        if config.counters:
            clock.start("counters")
            # The profiled process takes the device lock itself: shared while it starts and
            # compiles, as checks do, alone only for the profiled forward (ncu replaying its
            # kernels), so that others' timings go on during the seconds it takes to start.
            with self.lock.released():
                counters = collect(problem.path, candidate_path, config.seeds[0],
                                   config.counters_timeout_s, device.type, self.lock.path)
            verdict.counters = counters.to_dict()
        verdict.diagnosis = str(diagnose(report, gpu_latency, trials[0].floor_ms,
                                         verdict.baseline_ms, counters))
        clock.start("checks")
        after_seed = base + max(config.seeds) + 1
        label = f"seed {after_seed} after timing"
        try:
            with torch.no_grad():
                self.checked_trial(models, label, after_seed, device, config, anchors,
                                   deadline, previous=[])
        except Rejected as rejection:
            if rejection.code not in (Reason.WRONG_VALUES, Reason.UNWRITTEN_OUTPUT,
                                      Reason.NAN_INF, Reason.CACHED_RESULT,
                                      Reason.SHAPE_MISMATCH, Reason.DTYPE_MISMATCH):
                raise
            raise Rejected(Reason.WRONG_AFTER_TIMING,
                           f"correct at first, wrong after being timed: {rejection.reason}"
                           ) from rejection
        verdict.trials_checked.append(label)

    def checked_trial(self, models: Models, label: str, seed: int | None, device: torch.device,
                      config: EvalConfig, anchors: set[str], deadline: float,
                      previous: list[Trial], reused: Trial | None = None,
                      keep: bool = False, lead: int = 0) -> Trial:
        """One trial; `keep`: its input copies stay with it, for a later trial to reuse;
        `lead`: as `guard.guarded_buffer`'s, for its fresh copies."""
        trial = run_trial(models, label, lambda: self.pristine(seed, device), device, anchors,
                          config, deadline, None if reused is None else reused.copies,
                          keep=keep, lead=lead)
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

    def timed(self, verdict: Verdict, models: Models, seed: int, device: torch.device,
              config: EvalConfig, anchors: set[str], deadline: float) -> None:
        with torch.no_grad():
            time_both(verdict, models, lambda: self.pristine(seed, device), device, config,
                      anchors, deadline, self.lock)

    def reverify(self, verdict: Verdict, models: Models, base: int, timing_seed: int,
                 device: torch.device, config: EvalConfig, anchors: set[str],
                 deadline: float) -> None:
        first = verdict.speedup or 0.0
        with torch.no_grad():
            for seed in config.seeds:
                fresh = base + seed + REVERIFY_SEED_OFFSET
                label = f"seed {fresh} (re-verification)"
                self.checked_trial(models, label, fresh, device, config, anchors, deadline,
                                   previous=[])
                verdict.trials_checked.append(label)
        self.timed(verdict, models, timing_seed, device, config, anchors, deadline)
        second = verdict.speedup or 0.0
        verdict.flagged = True
        if second < first / 2:
            raise Rejected(Reason.SPEEDUP_NOT_REPRODUCED,
                           f"measured {first:.1f}x, then {second:.1f}x when timed again")
