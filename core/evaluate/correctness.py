"""Compare a candidate's outputs with the reference's, and its inputs with what they were.

Tolerances are relative to the reference's scale: an element passes when
`|out - ref| <= tol * (scale + |ref|)`, `scale` being the reference output's largest finite
magnitude. A loose absolute tolerance would pass an all-zero answer for a tiny output; a purely
relative one would fail harmless rounding next to zero.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from core.evaluate.guard import BITS_VIEW, poison_mask
from core.evaluate.verdict import Reason

TOLERANCES = {"fp64": 1e-7, "fp32": 1e-4, "tf32": 3e-4, "fp16": 1e-2, "bf16": 1e-2, "exact": 0.0}
DTYPE_TOLERANCE = {
    torch.float64: "fp64", torch.float32: "fp32", torch.float16: "fp16",
    torch.bfloat16: "bf16",
}


@dataclass
class Mismatch:
    code: Reason
    message: str


@dataclass
class Comparison:
    max_abs_err: float = 0.0
    max_rel_err: float = 0.0
    mismatch: Mismatch | None = None


def tolerance_name(dtype: torch.dtype, anchors: set[str], device: str) -> str:
    """fp32 matmul and conv sites on a GPU are held to tf32: Triton's `tl.dot` and cuDNN's
    convolutions use tf32 for fp32 inputs by default."""
    name = DTYPE_TOLERANCE.get(dtype, "exact")
    if name == "fp32" and anchors and device == "cuda":
        return "tf32"
    return name


def flatten(output: object) -> list[object]:
    if isinstance(output, tuple | list):
        return [leaf for item in output for leaf in flatten(item)]
    if isinstance(output, dict):
        return [leaf for key in sorted(output) for leaf in flatten(output[key])]
    return [output]


def first_index(mask: torch.Tensor) -> tuple[int, ...]:
    flat = int(mask.reshape(-1).nonzero()[0, 0])
    return tuple(int(i) for i in torch.unravel_index(torch.tensor(flat), mask.shape))


def same_bits(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Elementwise bit equality (NaNs with equal payloads are equal)."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return torch.zeros((), dtype=torch.bool)
    bits = BITS_VIEW.get(a.element_size())
    if bits is None or a.is_complex():
        return a == b
    return a.contiguous().view(bits) == b.contiguous().view(bits)


def outputs_identical(a: object, b: object) -> bool:
    leaves_a, leaves_b = flatten(a), flatten(b)
    if len(leaves_a) != len(leaves_b):
        return False
    for x, y in zip(leaves_a, leaves_b, strict=True):
        if isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor):
            if x.shape != y.shape or not bool(same_bits(x, y).all()):
                return False
        elif x != y:
            return False
    return True


def changed_inputs(before: list[object], after: list[object]) -> Mismatch | None:
    for index, (old, new) in enumerate(zip(before, after, strict=True)):
        if not isinstance(old, torch.Tensor):
            continue
        equal = same_bits(old, new)
        if not bool(equal.all()):
            differing = ~equal
            where = first_index(differing)
            return Mismatch(
                Reason.MUTATED_INPUT,
                f"input {index} was changed in place: {int(differing.sum())} of {old.numel()} "
                f"elements differ, first at {where} ({old[where].item()!r} became "
                f"{new[where].item()!r})",
            )
    return None


def compare_tensor(index: int, out: torch.Tensor, ref: torch.Tensor, tol: float,
                   tol_name: str) -> Comparison:
    label = f"output {index}"
    if out.shape != ref.shape:
        return Comparison(mismatch=Mismatch(
            Reason.SHAPE_MISMATCH,
            f"{label} has shape {tuple(out.shape)}, the reference {tuple(ref.shape)}"))
    if out.dtype != ref.dtype:
        return Comparison(mismatch=Mismatch(
            Reason.DTYPE_MISMATCH, f"{label} has dtype {out.dtype}, the reference {ref.dtype}"))
    if out.numel() == 0:
        return Comparison()
    out = out.to(ref.device)
    unwritten = poison_mask(out) & ~poison_mask(ref)
    if bool(unwritten.any()):
        return Comparison(mismatch=Mismatch(
            Reason.UNWRITTEN_OUTPUT,
            f"{label}: {int(unwritten.sum())} of {out.numel()} elements were never written "
            f"(they still hold the poison pattern), first at {first_index(unwritten)}"))
    exact = not out.is_floating_point()
    work = torch.float64 if ref.dtype == torch.float64 or exact else torch.float32
    out_w, ref_w = out.to(work), ref.to(work)
    out_nan, ref_nan = out_w.isnan(), ref_w.isnan()
    infinite = (out_w.isinf() | ref_w.isinf()) & (out_w != ref_w) & ~(out_nan | ref_nan)
    special = (out_nan != ref_nan) | infinite
    if bool(special.any()):
        where = first_index(special)
        return Comparison(mismatch=Mismatch(
            Reason.NAN_INF,
            f"{label}: {int(special.sum())} elements are NaN/Inf where the reference's are not "
            f"(or the other way round), first at {where}: got {out[where].item()}, expected "
            f"{ref[where].item()}"))
    out_finite, ref_finite = torch.isfinite(out_w), torch.isfinite(ref_w)
    both = out_finite & ref_finite
    ref_abs = torch.where(both, ref_w.abs(), 0)
    diff = torch.where(both, (out_w - ref_w).abs(), 0)
    scale = ref_abs.max()
    allowed_unit = (scale + ref_abs).clamp_min(torch.finfo(work).tiny)
    rel = (diff / allowed_unit).clamp_max(1e30)
    result = Comparison(max_abs_err=float(diff.max()), max_rel_err=float(rel.max()))
    bad = diff > 0 if exact else rel > tol
    if bool(bad.any()):
        where = first_index(bad)
        result.mismatch = Mismatch(
            Reason.WRONG_VALUES,
            f"{label}: {int(bad.sum())} of {out.numel()} elements are outside the {tol_name} "
            f"tolerance {tol:g} (relative to the reference's scale {float(scale):.4g}); worst "
            f"relative error {result.max_rel_err:.3g}, absolute {result.max_abs_err:.3g}; first "
            f"at {where}: got {out[where].item():.6g}, expected {ref[where].item():.6g}")
    return result


def compare_outputs(out: object, ref: object, tolerances: dict[torch.dtype, tuple[str, float]]
                    ) -> Comparison:
    """Compare every tensor of two (possibly nested) outputs; the first mismatch wins."""
    outs, refs = flatten(out), flatten(ref)
    if len(outs) != len(refs):
        return Comparison(mismatch=Mismatch(
            Reason.OUTPUT_STRUCTURE,
            f"the candidate returned {len(outs)} values, the reference {len(refs)}"))
    total = Comparison()
    for index, (o, r) in enumerate(zip(outs, refs, strict=True)):
        if not isinstance(r, torch.Tensor):
            if o != r:
                return Comparison(mismatch=Mismatch(
                    Reason.OUTPUT_STRUCTURE, f"output {index} is {o!r}, the reference {r!r}"))
            continue
        if not isinstance(o, torch.Tensor):
            return Comparison(mismatch=Mismatch(
                Reason.OUTPUT_STRUCTURE,
                f"output {index} is a {type(o).__name__}, the reference a tensor"))
        tol_name, tol = tolerances.get(r.dtype, ("exact", 0.0))
        one = compare_tensor(index, o, r, tol, tol_name)
        total.max_abs_err = max(total.max_abs_err, one.max_abs_err)
        total.max_rel_err = max(total.max_rel_err, one.max_rel_err)
        if one.mismatch:
            total.mismatch = one.mismatch
            return total
    return total
