"""One trial of a candidate: the candidate on guarded copies of the inputs, then the reference,
and the comparison.

The judge allocates the candidate's copies of the inputs (shared memory, between guard bands)
and hands them to the candidate's process (`core.evaluate.candidate`), which hands back its
outputs; the judge checks from outside the copies' bands and values, runs the reference on the
trial's own inputs and compares. A trial holds its inputs, the candidate's copies of them and
both outputs, and no more: outputs are compared a piece at a time, and what a later trial needs
of this one is the output's fingerprint. A trial's copies are freed once the candidate's call
is checked, before the reference runs, except the second's, which are refilled for the third:
that trial runs its reference first, on inputs drawn for it alone. The second's fresh copies
hold their data a page further into their buffers than the first's, so that memory the
allocator hands back holds it at other addresses. So the judge's peak is twice the inputs and
once the outputs, or the inputs and the reference's outputs and temporaries, whichever is more.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from core.evaluate.candidate import CallResult, CandidateProcess, Rejected
from core.evaluate.config import EvalConfig
from core.evaluate.correctness import (
    Comparison,
    changed_inputs,
    compare_outputs,
    dtype_tolerances,
    fingerprint,
    flatten,
)
from core.evaluate.diagnosis import moved_bytes
from core.evaluate.exact_reference import as_close_as_pytorch, exact_answer, no_room_for_exact
from core.evaluate.exchange import Opaque, SharedInput
from core.evaluate.guard import ANCHOR_OPS
from core.evaluate.verdict import Reason
from core.runtime.errors import error_line, out_of_memory
from core.timing.timer import synchronize


@dataclass
class Trial:
    label: str
    comparison: Comparison
    fingerprint: list[object]  # of the candidate's output (`correctness.fingerprint`)
    floor_ms: float  # the inputs read once and the outputs written once, at full bandwidth
    impossible_ms: float  # what no kernel can beat (`GpuPeaks.impossible_seconds`)
    # The candidate's input copies, kept from the first trial for a later one to reuse; None
    # once used.
    copies: list[object] | None = None


@dataclass
class Models:
    reference: torch.nn.Module
    candidate: CandidateProcess
    tolerances: dict[torch.dtype, tuple[str, float]] = field(default_factory=dict)
    library_ops: set[str] = field(default_factory=set)
    launches: int = 0
    # Whether some output passed only against fp64 (`core.evaluate.exact_reference`).
    against_exact: bool = False


def judge_failure(err: BaseException, doing: str) -> Rejected:
    """The judge's own work failed (not the candidate's): out of memory drawing inputs or in
    the reference's forward, say."""
    if out_of_memory(err):
        return Rejected(Reason.JUDGE_OUT_OF_MEMORY,
                        f"the evaluator ran out of device memory {doing}: what judging the "
                        f"problem takes does not fit beside what else holds the device "
                        f"({error_line(err)})",
                        healthy=False)
    return Rejected(Reason.JUDGE_ERROR, f"the evaluator failed {doing}: {error_line(err)}",
                    healthy=False)


def shared_copies(models: Models, pristine: list[object], deadline: float,
                  lead: int = 0) -> list[object]:
    """The candidate's guarded copies of a trial's inputs, in memory its process can map; the
    copies it no longer needs are freed first. `lead`: as `guard.guarded_buffer`'s."""
    models.candidate.release(deadline)
    return [models.candidate.side.shared_copy(t, f"input {i}", lead)
            if isinstance(t, torch.Tensor) else t for i, t in enumerate(pristine)]


def forget_copies(models: Models, copies: list[object]) -> None:
    """The candidate's process may let go of these copies (told with the next request)."""
    for copy in copies:
        if isinstance(copy, SharedInput):
            models.candidate.side.forget(copy)


def refill(copies: list[object], pristine: list[object]) -> list[object] | None:
    """`copies` holding the values of `pristine`, when every tensor has the same layout."""
    pairs = list(zip(copies, pristine, strict=True))
    if not all(not isinstance(v, torch.Tensor) or (
            isinstance(c, SharedInput) and c.tensor.shape == v.shape
            and c.tensor.dtype == v.dtype and c.tensor.stride() == v.stride())
            for c, v in pairs):
        return None
    for copy, value in pairs:
        if isinstance(value, torch.Tensor):
            copy.tensor.copy_(value)
    return copies


def tensors_of(copies: list[object]) -> list[object]:
    return [c.tensor if isinstance(c, SharedInput) else c for c in copies]


def checked_call(models: Models, label: str, copies: list[object], deadline: float,
                 anchors: set[str]) -> CallResult:
    """One call of the candidate, with everything the judge can check of it without a
    reference: its guard's report, the bands of the copies it was handed, its outputs' types."""
    result = models.candidate.call(copies, deadline)
    overwritten = result.out_of_bounds + [
        f"{changed} guard bytes around {c.buffer.label} were overwritten"
        for c in copies if isinstance(c, SharedInput) and c.buffer is not None
        and (changed := c.buffer.changed_guard_bytes())]
    if overwritten:
        raise Rejected(Reason.OUT_OF_BOUNDS_WRITE, f"{label}: wrote out of bounds: "
                                                   + "; ".join(overwritten))
    check_trace(result, anchors, label)
    models.launches = max(models.launches, result.launches)
    models.library_ops.update(result.library_ops)
    opaque = [leaf for leaf in flatten(result.outputs) if isinstance(leaf, Opaque)]
    if opaque:
        raise Rejected(Reason.OUTPUT_STRUCTURE, f"{label}: returned {opaque[0].description}; "
                                                "a candidate returns plain tensors")
    return result


def run_trial(models: Models, label: str, draw: Callable[[], list[object]],
              device: torch.device, anchors: set[str], config: EvalConfig, deadline: float,
              reuse: list[object] | None = None, keep: bool = False,
              lead: int = 0) -> Trial:
    """Candidate first, on poisoned guarded copies of the trial's inputs (`draw()`, the same
    values at every call) or on the copies of `reuse` refilled with them; then the reference on
    the inputs themselves, which nothing reads after. `keep`: the trial holds on to the
    candidate's copies, and its reference runs first, on a draw of its own, so that the
    reference's temporaries never meet the copies. `lead`: as `guard.guarded_buffer`'s, for
    fresh copies."""
    reference_out = models.reference(*draw()) if keep else None
    pristine = draw()
    copies = refill(reuse, pristine) if reuse is not None else None
    if copies is None:
        copies = shared_copies(models, pristine, deadline, lead)
    result = checked_call(models, label, copies, deadline, anchors)
    mutated = changed_inputs(pristine, tensors_of(copies))
    if mutated:
        raise Rejected(mutated.code, f"{label}: {mutated.message}")
    digest = fingerprint(result.outputs)
    if not keep:
        # Done with: the copies are freed before the reference runs, whose temporaries come
        # on top of its inputs (the judge lets go first, so that the release frees them). Reused
        # copies are the earlier trial's list: emptied in place, so that it holds none either.
        forget_copies(models, copies)
        copies.clear()
        models.candidate.release(deadline)
    if reference_out is None:
        reference_out = models.reference(*pristine)
    synchronize(device)
    read, written = moved_bytes(pristine, reference_out)
    floor_ms = config.peaks.bytes_seconds(read, written) * 1e3
    impossible_ms = config.peaks.impossible_seconds(read, written) * 1e3
    if not models.tolerances:
        models.tolerances = tolerances_for(reference_out, anchors, config)
    comparison = compare_outputs(result.outputs, reference_out, models.tolerances)
    if comparison.mismatch is not None and comparison.mismatch.code is Reason.WRONG_VALUES:
        comparison = second_opinion(models, pristine, result.outputs, reference_out,
                                    comparison)
    return Trial(label, comparison, digest, floor_ms, impossible_ms, copies if keep else None)


def second_opinion(models: Models, pristine: list[object], out: object, reference_out: object,
                   failed: Comparison) -> Comparison:
    """`failed` stands unless the outputs are as close to the fp64 answer as PyTorch's are."""
    assert failed.mismatch is not None
    no_room = no_room_for_exact(models.reference, pristine, reference_out,
                                models.candidate.device)
    if no_room is not None:
        failed.mismatch.message += f" (no fp64 second opinion: {no_room})"
        return failed
    try:
        exact = exact_answer(models.reference, pristine)
    except (torch.OutOfMemoryError, RuntimeError) as err:  # the failure stands, and says why
        failed.mismatch.message += f" (no fp64 second opinion: {error_line(err)})"
        return failed
    against = as_close_as_pytorch(out, reference_out, exact, models.tolerances)
    if against is None:
        return failed
    models.against_exact = True
    return against


def check_trace(result: CallResult, anchors: set[str], label: str) -> None:
    if result.launches == 0:
        raise Rejected(Reason.NO_KERNEL_LAUNCHED,
                       f"{label}: forward launched no custom kernel (torch ops only: "
                       f"{', '.join(sorted(result.ops)) or 'none'})")
    if result.compute_ops:
        raise Rejected(Reason.TORCH_COMPUTE,
                       f"{label}: forward computes with torch ({', '.join(result.compute_ops)}); "
                       "the site's work must be done by the candidate's own kernels")
    families = {ANCHOR_OPS.get(op, op) for op in result.library_ops}
    if families - anchors:
        raise Rejected(Reason.LIBRARY_OP_NOT_ALLOWED,
                       f"{label}: forward calls library ops {', '.join(result.library_ops)}, "
                       f"allowed only for the site's anchor op (this site has "
                       f"{', '.join(sorted(anchors)) or 'none'})")


def tolerances_for(reference_out: object, anchors: set[str], config: EvalConfig
                   ) -> dict[torch.dtype, tuple[str, float]]:
    tolerances = dtype_tolerances(reference_out, config.tf32_for(anchors), config.device)
    if config.tolerance is None:
        return tolerances
    return {dtype: (f"{name} overridden", config.tolerance)
            for dtype, (name, _) in tolerances.items()}
