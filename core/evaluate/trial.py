"""One trial of a candidate: the candidate on guarded copies of the inputs, then the reference,
and the comparison; and how a failure along the way becomes a rejection.

A trial holds its inputs, the candidate's copies of them and both outputs, and no more: the
reference runs on the trial's own inputs, outputs are compared a piece at a time, and what a
later trial needs of this one is the output's fingerprint. The first trial's copies wait for the
third trial, which reuses them; so the judge's peak is three times the inputs and twice the
outputs.
"""

from __future__ import annotations

import traceback
from dataclasses import dataclass, field
from pathlib import Path

import torch

from core.evaluate.config import EvalConfig
from core.evaluate.correctness import (
    TOLERANCES,
    Comparison,
    changed_inputs,
    compare_outputs,
    fingerprint,
    flatten,
    tolerance_name,
)
from core.evaluate.diagnosis import byte_floor_ms
from core.evaluate.guard import ANCHOR_OPS, Guard, GuardedBuffer, guarded_copy
from core.evaluate.verdict import Reason
from core.runtime.errors import error_line
from core.runtime.problem_loader import Problem
from core.timing.timer import synchronize

COMPILE_ERRORS = ("CompilationError", "CompileError", "CompileTimeAssertionFailure")
OOM_MARKERS = ("out of memory", "can't allocate memory", "OutOfMemory")
CUDA_ERROR_MARKERS = ("CUDA error", "illegal memory access", "LaunchError", "cudaError",
                      "misaligned address", "unspecified launch failure")


class Rejected(Exception):  # noqa: N818 - control flow: a verdict found mid-way
    def __init__(self, code: Reason, reason: str, compiled: bool = True, log: str = "",
                 healthy: bool = True) -> None:
        super().__init__(reason)
        self.code, self.reason, self.compiled, self.log = code, reason, compiled, log
        self.healthy = healthy


@dataclass
class Trial:
    label: str
    comparison: Comparison
    fingerprint: list[object]  # of the candidate's output (`correctness.fingerprint`)
    floor_ms: float  # the inputs read once and the outputs written once, at full bandwidth
    # The candidate's input copies and their guard bands, kept from the first trial for the
    # second to reuse; None once used.
    buffers: list[tuple[object, GuardedBuffer | None]] | None = None


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


def judge_failure(err: BaseException, doing: str) -> Rejected:
    """The judge's own work failed (not the candidate's): out of memory drawing inputs, say."""
    if isinstance(err, torch.OutOfMemoryError) or any(m in str(err) for m in OOM_MARKERS):
        return Rejected(Reason.JUDGE_OUT_OF_MEMORY,
                        f"the evaluator ran out of device memory {doing}: the problem's inputs "
                        f"do not fit beside what else holds the device ({error_line(err)})",
                        healthy=False)
    return Rejected(Reason.JUDGE_ERROR, f"the evaluator failed {doing}: {error_line(err)}",
                    healthy=False)


def build_models(problem: Problem, model_new: type, seed: int, device: torch.device) -> Models:
    """Both models built after the same seed, as KernelBench does, so parameters agree."""
    init = problem.init_inputs()
    torch.manual_seed(seed)
    reference = problem.model_class(*init).to(device).eval()
    torch.manual_seed(seed)
    candidate = model_new(*init).to(device).eval()
    return Models(reference=reference, candidate=candidate)


def run_trial(models: Models, label: str, pristine: list[object], device: torch.device,
              anchors: set[str], config: EvalConfig,
              reuse: list[tuple[object, GuardedBuffer | None]] | None = None,
              keep: bool = False) -> Trial:
    """Candidate first, on poisoned guarded copies of `pristine` (or on the buffers of `reuse`
    holding its values); then the reference on `pristine` itself, which nothing reads after.
    `keep`: the trial holds on to the candidate's input buffers."""
    same_layout = reuse is not None and all(
        not isinstance(v, torch.Tensor) or (isinstance(b, torch.Tensor) and b.shape == v.shape
                                            and b.dtype == v.dtype)
        for (b, _), v in zip(reuse, pristine, strict=True))
    if reuse is not None and same_layout:
        copies = [(b.copy_(v), g) if isinstance(v, torch.Tensor) else (v, None)
                  for (b, g), v in zip(reuse, pristine, strict=True)]
    else:
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
    digest = fingerprint(candidate_out)
    reference_out = models.reference(*pristine)
    synchronize(device)
    floor_ms = byte_floor_ms(pristine, reference_out)
    if not models.tolerances:
        models.tolerances = tolerances_for(reference_out, anchors, config)
    comparison = compare_outputs(candidate_out, reference_out, models.tolerances)
    return Trial(label, comparison, digest, floor_ms, copies if keep else None)


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
