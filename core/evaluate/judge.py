"""Judge one candidate against one problem inside the current (worker) process.

Order of work: import the candidate, build `Model` and `ModelNew` seeded alike, then for every
seed and the captured inputs run the candidate first (poisoned, guarded allocations, fresh input
copies) and the reference second, and compare; feed the first trial's input buffers new contents
to catch results cached by pointer; time reference and candidate alike; re-verify a speedup above
the threshold; check once more on unseen inputs after timing.
"""

from __future__ import annotations

import os
import traceback
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path

import torch

from core.evaluate.config import EvalConfig
from core.evaluate.correctness import (
    TOLERANCES,
    Comparison,
    changed_inputs,
    compare_outputs,
    flatten,
    outputs_identical,
    tolerance_name,
)
from core.evaluate.counters import collect
from core.evaluate.diagnosis import byte_floor_ms, diagnose
from core.evaluate.guard import ANCHOR_OPS, Guard, guarded_copy
from core.evaluate.kernel_report import candidate_report
from core.evaluate.verdict import Reason, Verdict
from core.runtime.problem_loader import (
    Problem,
    import_file,
    load_problem,
    on_device,
    write_candidate,
)
from core.timing.device_lock import DeviceLock
from core.timing.model_timing import clone_inputs, rotation_copies, time_model
from core.timing.timer import TimingStats, synchronize

COMPILE_ERRORS = ("CompilationError", "CompileError", "CompileTimeAssertionFailure")
OOM_MARKERS = ("out of memory", "can't allocate memory", "OutOfMemory")
CUDA_ERROR_MARKERS = ("CUDA error", "illegal memory access", "LaunchError", "cudaError",
                      "misaligned address", "unspecified launch failure")
REVERIFY_SEED_OFFSET = 1000


class Rejected(Exception):  # noqa: N818 - control flow: a verdict found mid-way
    def __init__(self, code: Reason, reason: str, compiled: bool = True, log: str = "",
                 healthy: bool = True) -> None:
        super().__init__(reason)
        self.code, self.reason, self.compiled, self.log = code, reason, compiled, log
        self.healthy = healthy


@dataclass
class Trial:
    label: str
    pristine: list[object]
    candidate_inputs: list[object]
    candidate_out: object
    reference_out: object
    comparison: Comparison


@dataclass
class Models:
    reference: torch.nn.Module
    candidate: torch.nn.Module
    tolerances: dict[torch.dtype, tuple[str, float]] = field(default_factory=dict)
    library_ops: set[str] = field(default_factory=set)
    launches: int = 0


def candidate_frames(err: BaseException, candidate_path: Path) -> str:
    """The traceback lines inside the candidate's own file, with line numbers, then the error."""
    frames = [f for f in traceback.extract_tb(err.__traceback__)
              if f.filename == str(candidate_path)]
    lines = [f"  line {f.lineno}, in {f.name}: {f.line}" for f in frames]
    return "\n".join([*lines, f"{type(err).__name__}: {err}"])


def classify(err: BaseException, candidate_path: Path) -> Rejected:
    text = f"{type(err).__name__}: {err}"
    names = {cls.__name__ for cls in type(err).__mro__}
    detail = candidate_frames(err, candidate_path)
    if names & set(COMPILE_ERRORS) or isinstance(err, SyntaxError):
        log = str(err)
        if isinstance(err, SyntaxError):
            log = f"line {err.lineno}: {err.msg}\n    {(err.text or '').rstrip()}"
        stderr = getattr(err, "stderr", None)
        if stderr:
            log = f"{log}\n{stderr}"
        return Rejected(Reason.COMPILE_ERROR, f"does not compile: {log.splitlines()[0]}",
                        compiled=False, log=log)
    if isinstance(err, torch.OutOfMemoryError) or any(m in text for m in OOM_MARKERS):
        return Rejected(Reason.OUT_OF_MEMORY, f"ran out of memory: {detail}", healthy=False)
    if any(marker in text for marker in CUDA_ERROR_MARKERS):
        return Rejected(Reason.CUDA_ERROR, f"CUDA error (the worker's context is now unusable): "
                                           f"{detail}", healthy=False)
    return Rejected(Reason.RUNTIME_ERROR, f"raised {detail}")


class Judge:
    """Judges candidates in this process, keeping the last problem and its inputs loaded."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.problem_key: tuple[str, int] | None = None
        self.problem: Problem | None = None
        self.inputs: dict[str, list[object]] = {}
        self.lock = DeviceLock(None)
        self.holds = ExitStack()

    def load(self, path: str, device: torch.device) -> Problem:
        resolved = Path(path).resolve()
        key = (str(resolved), resolved.stat().st_mtime_ns)
        if key != self.problem_key or self.problem is None:
            self.problem, self.problem_key, self.inputs = load_problem(resolved), key, {}
        return self.problem

    def pristine(self, label: str, seed: int | None, device: torch.device) -> list[object]:
        if label not in self.inputs:
            assert self.problem is not None
            raw = self.problem.inputs(seed) if seed is not None else self.problem.captured_inputs
            self.inputs[label] = on_device(list(raw or []), device)
        return self.inputs[label]

    def judge(self, problem_path: str, source: str, config: EvalConfig, anchors: set[str],
              on_phase: Callable[[str], None]) -> tuple[Verdict, bool]:
        """The verdict, and whether this process is still fit to judge the next candidate."""
        device = torch.device(config.device)
        problem = self.load(problem_path, device)
        candidate_path, module_name = write_candidate(source, self.workdir)
        verdict = Verdict(timing_device=timing_label(device))
        self.lock, self.holds = DeviceLock(config.gpu_lock), ExitStack()
        try:
            with self.holds:
                self.run_checks(verdict, problem, candidate_path, module_name, config,
                                anchors, on_phase)
        except Rejected as rejection:
            verdict.reason_code, verdict.reason = rejection.code, rejection.reason
            verdict.compile_log = rejection.log
            verdict.compiled = verdict.compiled and rejection.compiled
            verdict.correct = verdict.accepted = False
            return verdict, rejection.healthy and context_healthy(device)
        verdict.accepted = True
        return verdict, True

    def run_checks(self, verdict: Verdict, problem: Problem, candidate_path: Path,
                   module_name: str, config: EvalConfig, anchors: set[str],
                   on_phase: Callable[[str], None]) -> None:
        device = torch.device(config.device)
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
        with torch.no_grad():
            for label, seed in labels:
                trial = self.checked_trial(models, label, seed, device, config, anchors,
                                           candidate_path, previous=trials)
                if not trials:
                    on_phase("compiled")
                    # The first trial compiled the candidate (seconds of CPU work) without the
                    # device lock; from here on its kernels only run: they share the device with
                    # other checks, never with a timing.
                    self.holds.enter_context(self.lock.shared())
                trials.append(trial)
                verdict.trials_checked.append(label)
                record_errors(verdict, trial.comparison)
            check_pointer_cache(models, trials, candidate_path, device, anchors)
        verdict.correct = True
        report = candidate_report(module, candidate_path.read_text())
        verdict.kernel_report = report.to_dict()
        verdict.library_ops = sorted(models.library_ops)
        verdict.kernel_launches = models.launches
        name, tol = next(iter(models.tolerances.values()), ("exact", 0.0))
        verdict.tolerance_name, verdict.tolerance = name, tol
        if config.time:
            self.timed(verdict, models, trials[0].pristine, device, config)
        if verdict.speedup is not None and verdict.speedup > config.reverify_above:
            self.reverify(verdict, models, device, config, anchors, candidate_path)
        # Latencies measured on the CPU say nothing about a GPU's byte floor.
        gpu_latency = verdict.latency_ms if device.type == "cuda" else None
        counters = None
        if config.counters:
            # The profiled program takes the device lock itself, alone, around the forward
            # that ncu replays: those kernels must not overlap anyone's, nor anyone's them.
            with self.lock.released():
                counters = collect(problem.path, candidate_path, config.seeds[0],
                                   config.counters_timeout_s, device.type, config.gpu_lock)
            verdict.counters = counters.to_dict()
        verdict.diagnosis = str(diagnose(report, gpu_latency, byte_floor_ms(
            trials[0].pristine, trials[0].reference_out), verdict.baseline_ms, counters))
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
                      previous: list[Trial]) -> Trial:
        pristine = self.pristine(label, seed, device)
        try:
            trial = run_trial(models, label, pristine, device, anchors, config)
        except Rejected:
            raise
        except Exception as err:
            raise classify(err, candidate_path) from err
        mismatch = trial.comparison.mismatch
        if mismatch:
            for earlier in previous:
                if outputs_identical(trial.candidate_out, earlier.candidate_out):
                    raise Rejected(Reason.CACHED_RESULT,
                                   f"{label}: returned the same output as for {earlier.label}, "
                                   f"whose inputs differ: results are cached across calls")
            raise Rejected(mismatch.code, f"{label}: {mismatch.message}")
        return trial

    def timed(self, verdict: Verdict, models: Models, pristine: list[object],
              device: torch.device, config: EvalConfig) -> None:
        copies = rotation_copies(pristine, device, config.rotation_budget_bytes // 2)
        base_sets = [clone_inputs(pristine) for _ in range(copies)]
        cand_sets = [clone_inputs(pristine) for _ in range(copies)]
        with self.lock.exclusive():
            base = time_model(models.reference, base_sets, device, config.warmup_count,
                              config.trial_count, config.warmup_time_ms)
            cand = time_model(models.candidate, cand_sets, device, config.warmup_count,
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
        self.timed(verdict, models, self.pristine(f"seed {config.seeds[0]}", config.seeds[0],
                                                   device), device, config)
        second = verdict.speedup or 0.0
        verdict.flagged = True
        if second < first / 2:
            raise Rejected(Reason.SPEEDUP_NOT_REPRODUCED,
                           f"measured {first:.1f}x, then {second:.1f}x when timed again")


def build_models(problem: Problem, model_new: type, seed: int, device: torch.device) -> Models:
    """Both models built after the same seed, as KernelBench does, so parameters agree."""
    init = problem.init_inputs()
    torch.manual_seed(seed)
    reference = problem.model_class(*init).to(device).eval()
    torch.manual_seed(seed)
    candidate = model_new(*init).to(device).eval()
    return Models(reference=reference, candidate=candidate)


def run_trial(models: Models, label: str, pristine: list[object], device: torch.device,
              anchors: set[str], config: EvalConfig) -> Trial:
    """Candidate first, on poisoned guarded copies; then the reference on fresh copies."""
    copies = [guarded_copy(t, f"input {i}") if isinstance(t, torch.Tensor) else (t, None)
              for i, t in enumerate(pristine)]
    candidate_inputs = [tensor for tensor, _ in copies]
    with Guard() as guard:
        candidate_out = models.candidate(*candidate_inputs)
    synchronize(device)
    overwritten = guard.out_of_bounds() + [
        f"{buffer.changed_guard_bytes()} guard bytes around {buffer.label} were overwritten"
        for _, buffer in copies if buffer is not None and buffer.changed_guard_bytes()
    ]
    if overwritten:
        raise Rejected(Reason.OUT_OF_BOUNDS_WRITE, f"{label}: wrote out of bounds: "
                                                   + "; ".join(overwritten))
    check_trace(guard, anchors, label)
    models.launches = max(models.launches, guard.launches)
    models.library_ops.update(guard.library_ops())
    mutated = changed_inputs(pristine, candidate_inputs)
    if mutated:
        raise Rejected(mutated.code, f"{label}: {mutated.message}")
    reference_out = models.reference(*clone_inputs(pristine))
    synchronize(device)
    if not models.tolerances:
        models.tolerances = tolerances_for(reference_out, anchors, config)
    return Trial(label, pristine, candidate_inputs, candidate_out, reference_out,
                 compare_outputs(candidate_out, reference_out, models.tolerances))


def check_trace(guard: Guard, anchors: set[str], label: str) -> None:
    if guard.launches == 0:
        raise Rejected(Reason.NO_KERNEL_LAUNCHED,
                       f"{label}: forward launched no custom kernel (torch ops only: "
                       f"{', '.join(sorted(guard.ops)) or 'none'})")
    compute = guard.compute_ops()
    if compute:
        raise Rejected(Reason.TORCH_COMPUTE,
                       f"{label}: forward computes with torch ({', '.join(compute)}); the site's "
                       "work must be done by the candidate's own kernels")
    families = {ANCHOR_OPS[op] for op in guard.library_ops()}
    if families - anchors:
        raise Rejected(Reason.LIBRARY_OP_NOT_ALLOWED,
                       f"{label}: forward calls library ops {', '.join(guard.library_ops())}, "
                       f"allowed only for the site's anchor op (this site has "
                       f"{', '.join(sorted(anchors)) or 'none'})")


def check_pointer_cache(models: Models, trials: list[Trial], candidate_path: Path,
                        device: torch.device, anchors: set[str]) -> None:
    """Give the first trial's input buffers the second trial's values and call again."""
    first, second = trials[0], trials[1]
    same_shapes = all(
        not isinstance(a, torch.Tensor) or (isinstance(b, torch.Tensor) and a.shape == b.shape)
        for a, b in zip(first.candidate_inputs, second.pristine, strict=True)
    )
    if not same_shapes:
        return
    for buffer, values in zip(first.candidate_inputs, second.pristine, strict=True):
        if isinstance(buffer, torch.Tensor):
            buffer.copy_(values)
    try:
        with Guard() as guard:
            again = models.candidate(*first.candidate_inputs)
        synchronize(device)
    except Exception as err:
        raise classify(err, candidate_path) from err
    check_trace(guard, anchors, "reused input buffers")
    comparison = compare_outputs(again, second.reference_out, models.tolerances)
    if comparison.mismatch is None:
        return
    if outputs_identical(again, first.candidate_out):
        raise Rejected(Reason.CACHED_RESULT,
                       "called again on the same input buffers holding new values, it returned "
                       "the previous result: results are cached by pointer")
    raise Rejected(comparison.mismatch.code,
                   f"reused input buffers: {comparison.mismatch.message}")


def tolerances_for(reference_out: object, anchors: set[str], config: EvalConfig
                   ) -> dict[torch.dtype, tuple[str, float]]:
    tolerances: dict[torch.dtype, tuple[str, float]] = {}
    for leaf in flatten(reference_out):
        if isinstance(leaf, torch.Tensor) and leaf.dtype not in tolerances:
            name = tolerance_name(leaf.dtype, anchors, config.device)
            if config.tolerance is not None:
                tolerances[leaf.dtype] = (f"{name} overridden", config.tolerance)
            else:
                tolerances[leaf.dtype] = (name, TOLERANCES[name])
    return tolerances


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

