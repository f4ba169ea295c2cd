"""Compare a candidate's outputs with the reference's, and its inputs with what they were.

Tolerances are relative to the reference's scale: an element passes when
`|out - ref| <= tol * (scale + |ref|)`, `scale` being the reference output's largest finite
magnitude. A loose absolute tolerance would pass an all-zero answer for a tiny output; a purely
relative one would fail harmless rounding next to zero.
"""

from __future__ import annotations

from collections.abc import Iterator
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


def tolerance_name(dtype: torch.dtype, tf32: bool, device: str) -> str:
    """fp32 outputs of a site whose baseline multiplies in TF32 on a GPU (`EvalConfig.tf32_for`)
    are held to TF32's tolerance; every other fp32 output to fp32's."""
    name = DTYPE_TOLERANCE.get(dtype, "exact")
    if name == "fp32" and tf32 and device == "cuda":
        return "tf32"
    return name


def dtype_tolerances(reference: object, tf32: bool, device: str
                     ) -> dict[torch.dtype, tuple[str, float]]:
    """Each floating or exact dtype among `reference`'s tensors, with its tolerance's name and
    value (`tolerance_name`)."""
    found: dict[torch.dtype, tuple[str, float]] = {}
    for leaf in flatten(reference):
        if isinstance(leaf, torch.Tensor) and leaf.dtype not in found:
            name = tolerance_name(leaf.dtype, tf32, device)
            found[leaf.dtype] = (name, TOLERANCES[name])
    return found


def flatten(output: object) -> list[object]:
    if isinstance(output, tuple | list):
        return [leaf for item in output for leaf in flatten(item)]
    if isinstance(output, dict):
        return [leaf for key in sorted(output) for leaf in flatten(output[key])]
    return [output]


# Comparisons walk their tensors this many elements at a time, so that a comparison's
# temporaries stay a bounded size however large the outputs (KernelBench inputs reach GBs).
# On a GPU, large pieces keep a gigabyte comparison to a few hundred launches; on the CPU, small
# ones keep the temporaries under the allocator's threshold for handing memory back.
CHUNK_ELEMENTS = {"cuda": 1 << 24, "cpu": 1 << 20}


def pieces(*tensors: torch.Tensor) -> Iterator[tuple[int, tuple[torch.Tensor, ...]]]:
    """Flat pieces of equally shaped tensors, CHUNK_ELEMENTS at most each, in row-major order,
    with the flat index of each piece's first element. Non-contiguous tensors are walked
    along their leading dimensions, so that no piece copies more than its own elements."""
    first = tensors[0]
    chunk = CHUNK_ELEMENTS.get(first.device.type, CHUNK_ELEMENTS["cpu"])
    if first.numel() <= chunk or first.dim() == 0:
        yield 0, tuple(t.reshape(-1) for t in tensors)
        return
    if all(t.is_contiguous() for t in tensors) or first.dim() == 1:
        flat = [t.reshape(-1) if t.is_contiguous() else t for t in tensors]
        for start in range(0, first.numel(), chunk):
            yield start, tuple(f[start:start + chunk].reshape(-1) for f in flat)
        return
    row = first[0].numel()
    step = max(1, chunk // max(row, 1))
    for start in range(0, first.shape[0], step):
        for offset, piece in pieces(*(t[start:start + step] for t in tensors)):
            yield start * row + offset, piece


@dataclass
class Found:
    """Elements of a tensor where a condition held: how many, and the first one's flat index."""

    count: int = 0
    first: int | None = None

    def add(self, offset: int, mask: torch.Tensor) -> None:
        count = int(mask.sum())
        if count and self.first is None:
            self.first = offset + int(mask.nonzero()[0, 0])
        self.count += count

    def where(self, shape: torch.Size) -> tuple[int, ...]:
        assert self.first is not None
        return tuple(int(i) for i in torch.unravel_index(torch.tensor(self.first), shape))


def same_bits(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Elementwise bit equality of two flat pieces (NaNs with equal payloads are equal)."""
    bits = BITS_VIEW.get(a.element_size())
    if bits is None or a.is_complex():
        return a == b
    return a.view(bits) == b.view(bits)


def fingerprint(output: object) -> list[object]:
    """A digest of an output, tensors by their exact bits: equal outputs have equal
    fingerprints, and different ones all but never do. Kept in place of a whole output to
    recognise results returned again for other inputs."""
    digest: list[object] = []
    for leaf in flatten(output):
        if not isinstance(leaf, torch.Tensor):
            digest.append(leaf)
            continue
        bits = BITS_VIEW.get(leaf.element_size())
        plain, weighted = 0, 0
        for offset, (piece,) in pieces(leaf.detach()):
            values = (piece.view(bits) if bits is not None and not piece.is_complex()
                      else piece.view(torch.uint8)).to(torch.int64)
            plain += int(values.sum())
            weights = torch.arange(offset, offset + values.numel(), device=values.device)
            weighted += int(weights.remainder_(65521).add_(1).mul_(values).sum())
        digest.append((tuple(leaf.shape), str(leaf.dtype), plain, weighted))
    return digest


def changed_inputs(before: list[object], after: list[object]) -> Mismatch | None:
    for index, (old, new) in enumerate(zip(before, after, strict=True)):
        if not isinstance(old, torch.Tensor):
            continue
        differing = Found()
        for offset, (a, b) in pieces(old, new):
            differing.add(offset, ~same_bits(a, b))
        if differing.count:
            where = differing.where(old.shape)
            return Mismatch(
                Reason.MUTATED_INPUT,
                f"input {index} was changed in place: {differing.count} of {old.numel()} "
                f"elements differ, first at {where} ({old[where].item()!r} became "
                f"{new[where].item()!r})",
            )
    return None


def _work_dtype(out: torch.Tensor, ref: torch.Tensor) -> torch.dtype:
    exact = not out.is_floating_point()
    return torch.float64 if ref.dtype == torch.float64 or exact else torch.float32


def compare_tensor(index: int, out: torch.Tensor, ref: torch.Tensor, tol: float,
                   tol_name: str) -> Comparison:
    """Two passes over the pair, a piece at a time: the first finds unwritten elements,
    NaN/Inf the reference lacks and the reference's scale; the second the errors against it."""
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
    out, ref = out.detach().to(ref.device), ref.detach()
    work, exact = _work_dtype(out, ref), not out.is_floating_point()
    unwritten, special, scale = Found(), Found(), torch.zeros((), dtype=work, device=ref.device)
    for offset, (o, r) in pieces(out, ref):
        unwritten.add(offset, poison_mask(o) & ~poison_mask(r))
        o, r = o.to(work), r.to(work)
        o_nan, r_nan = o.isnan(), r.isnan()
        infinite = (o.isinf() | r.isinf()) & (o != r) & ~(o_nan | r_nan)
        special.add(offset, (o_nan != r_nan) | infinite)
        both = o.isfinite() & r.isfinite()
        scale = torch.maximum(scale, torch.where(both, r.abs(), 0).max())
    if unwritten.count:
        return Comparison(mismatch=Mismatch(
            Reason.UNWRITTEN_OUTPUT,
            f"{label}: {unwritten.count} of {out.numel()} elements were never written "
            f"(they still hold the poison pattern), first at {unwritten.where(out.shape)}"))
    if special.count:
        where = special.where(out.shape)
        return Comparison(mismatch=Mismatch(
            Reason.NAN_INF,
            f"{label}: {special.count} elements are NaN/Inf where the reference's are not "
            f"(or the other way round), first at {where}: got {out[where].item()}, expected "
            f"{ref[where].item()}"))
    result, bad = Comparison(), Found()
    for offset, (o, r) in pieces(out, ref):
        o, r = o.to(work), r.to(work)
        both = o.isfinite() & r.isfinite()
        ref_abs = torch.where(both, r.abs(), 0)
        diff = torch.where(both, (o - r).abs(), 0)
        rel = (diff / (scale + ref_abs).clamp_min(torch.finfo(work).tiny)).clamp_max(1e30)
        result.max_abs_err = max(result.max_abs_err, float(diff.max()))
        result.max_rel_err = max(result.max_rel_err, float(rel.max()))
        bad.add(offset, diff > 0 if exact else rel > tol)
    if bad.count:
        where = bad.where(out.shape)
        result.mismatch = Mismatch(
            Reason.WRONG_VALUES,
            f"{label}: {bad.count} of {out.numel()} elements are outside the {tol_name} "
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
