"""Compare a candidate's outputs with the reference's, and its inputs with what they were.

Tolerances are relative to the reference's scale: an element passes when
`|out - ref| <= tol * (scale + |ref|)`, `scale` being the reference output's largest finite
magnitude. A loose absolute tolerance would pass an all-zero answer for a tiny output; a purely
relative one would fail harmless rounding next to zero.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch

from core.evaluate.compare_kernel import compare_in_one_pass, fusable
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


def first_where(tensors: tuple[torch.Tensor, ...],
                condition: Callable[..., torch.Tensor]) -> int | None:
    """The flat index of the first element where `condition` holds over the pieces of
    `tensors`, or None: read only once a count has said there is one."""
    for offset, piece in pieces(*tensors):
        hits = condition(*piece).nonzero()
        if hits.numel():
            return offset + int(hits[0, 0])
    return None


def unravel(index: int, shape: torch.Size) -> tuple[int, ...]:
    return tuple(int(i) for i in torch.unravel_index(torch.tensor(index), shape))


def same_bits(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Elementwise bit equality of two flat pieces (NaNs with equal payloads are equal)."""
    bits = BITS_VIEW.get(a.element_size())
    if bits is None or a.is_complex():
        return a == b
    return a.view(bits) == b.view(bits)


# A fingerprint widens each piece to int64 and weighs it: a quarter of a comparison's piece on a
# GPU, so that its temporaries (the values, their weights, the last part's values until the next
# replaces them) stay under 100 MB; at a comparison's size they were the judge's largest fixed
# cost (bench/NOTES.md, 2026-12-06, 05:10-05:37 UTC).
FINGERPRINT_PART = 1 << 22


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
            for start in range(0, piece.numel(), FINGERPRINT_PART):
                part = piece[start:start + FINGERPRINT_PART]
                values = (part.view(bits) if bits is not None and not part.is_complex()
                          else part.view(torch.uint8)).to(torch.int64)
                plain += int(values.sum())
                weights = torch.arange(offset + start, offset + start + values.numel(),
                                       device=values.device)
                weighted += int(weights.remainder_(65521).add_(1).mul_(values).sum())
        digest.append((tuple(leaf.shape), str(leaf.dtype), plain, weighted))
    return digest


def changed_inputs(before: list[object], after: list[object]) -> Mismatch | None:
    pairs = [(index, old, new) for index, (old, new) in enumerate(zip(before, after, strict=True))
             if isinstance(old, torch.Tensor)]
    if not pairs:
        return None
    # The differing elements of every input, counted on the device and read once.
    counts = torch.stack([sum((~same_bits(a, b)).sum() for _, (a, b) in pieces(old, new))
                          for _, old, new in pairs]).tolist()
    for (index, old, new), count in zip(pairs, counts, strict=True):
        if count:
            where = unravel(first_where((old, new), lambda a, b: ~same_bits(a, b)), old.shape)
            return Mismatch(
                Reason.MUTATED_INPUT,
                f"input {index} was changed in place: {count} of {old.numel()} "
                f"elements differ, first at {where} ({old[where].item()!r} became "
                f"{new[where].item()!r})",
            )
    return None


def _work_dtype(out: torch.Tensor, ref: torch.Tensor) -> torch.dtype:
    exact = not out.is_floating_point()
    return torch.float64 if ref.dtype == torch.float64 or exact else torch.float32


def _unwritten(o: torch.Tensor, r: torch.Tensor) -> torch.Tensor:
    return poison_mask(o) & ~poison_mask(r)


def _special(o: torch.Tensor, r: torch.Tensor, work: torch.dtype) -> torch.Tensor:
    """NaN where the reference has none (or the other way round), or an infinity it lacks."""
    o, r = o.to(work), r.to(work)
    o_nan, r_nan = o.isnan(), r.isnan()
    infinite = (o.isinf() | r.isinf()) & (o != r) & ~(o_nan | r_nan)
    return (o_nan != r_nan) | infinite


def _errors(o: torch.Tensor, r: torch.Tensor, work: torch.dtype, scale: torch.Tensor
            ) -> tuple[torch.Tensor, torch.Tensor]:
    """Absolute errors, and errors relative to the reference's scale, where both are finite."""
    o, r = o.to(work), r.to(work)
    both = o.isfinite() & r.isfinite()
    diff = torch.where(both, (o - r).abs(), 0)
    ref_abs = torch.where(both, r.abs(), 0)
    return diff, (diff / (scale + ref_abs).clamp_min(torch.finfo(work).tiny)).clamp_max(1e30)


def reference_scale(ref: torch.Tensor, work: torch.dtype) -> torch.Tensor:
    """The reference's largest finite magnitude, a 0-dim tensor of `work` on its device. (Where
    the output is not finite and the reference is, or the other way round, the comparison fails
    on NaN/Inf before it reads the scale: so the reference alone sets it, once for every output
    compared with it.)"""
    scale = torch.zeros((), dtype=work, device=ref.device)
    for _, (r,) in pieces(ref.detach()):
        r = r.to(work)
        scale = torch.maximum(scale, torch.where(r.isfinite(), r.abs(), 0).max())
    return scale


def reference_scales(ref: object) -> list[torch.Tensor | None]:
    """`reference_scale` of each tensor of a (possibly nested) reference output."""
    return [reference_scale(r, _work_dtype(r, r)) if isinstance(r, torch.Tensor) and r.numel()
            else None for r in flatten(ref)]


def _counts(out: torch.Tensor, ref: torch.Tensor, work: torch.dtype, exact: bool,
            scale: torch.Tensor, tol: float) -> torch.Tensor:
    """Unwritten elements, NaN/Inf mismatches, elements outside the tolerance, the largest
    absolute and relative errors: five float64 values on the device, a piece at a time."""
    unwritten = special = bad = torch.zeros((), dtype=torch.int64, device=ref.device)
    max_abs = max_rel = torch.zeros((), dtype=work, device=ref.device)
    for _, (o, r) in pieces(out, ref):
        unwritten = unwritten + _unwritten(o, r).sum()
        special = special + _special(o, r, work).sum()
        diff, rel = _errors(o, r, work, scale)
        max_abs, max_rel = torch.maximum(max_abs, diff.max()), torch.maximum(max_rel, rel.max())
        bad = bad + (diff > 0 if exact else rel > tol).sum()
    return torch.stack([unwritten.double(), special.double(), bad.double(), max_abs.double(),
                        max_rel.double()])


def compare_tensor(index: int, out: torch.Tensor, ref: torch.Tensor, tol: float,
                   tol_name: str, scale: torch.Tensor | None = None) -> Comparison:
    """One pass over the pair, counting unwritten elements, NaN/Inf the reference lacks and
    errors against the reference's scale (`scale`, or `reference_scale`'s). On a GPU one Triton
    kernel makes the pass (`compare_kernel`); elsewhere PyTorch's ops, a piece at a time. The
    counts and maxima stay on the device until the pass is done and are read once (every timed
    call is compared too); where a first bad element lies is looked for only when there is
    one."""
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
    scale = reference_scale(ref, work) if scale is None else scale
    if not exact and out.device.type == "cuda" and fusable(out, ref):
        counts = compare_in_one_pass(out, ref, scale, tol)
    else:
        counts = _counts(out, ref, work, exact, scale, tol)
    read = torch.cat([counts, scale.double().reshape(1)]).tolist()
    n_unwritten, n_special, n_bad = (int(count) for count in read[:3])
    if n_unwritten:
        where = unravel(first_where((out, ref), _unwritten), out.shape)
        return Comparison(mismatch=Mismatch(
            Reason.UNWRITTEN_OUTPUT,
            f"{label}: {n_unwritten} of {out.numel()} elements were never written "
            f"(they still hold the poison pattern), first at {where}"))
    if n_special:
        where = unravel(first_where((out, ref), lambda o, r: _special(o, r, work)), out.shape)
        return Comparison(mismatch=Mismatch(
            Reason.NAN_INF,
            f"{label}: {n_special} elements are NaN/Inf where the reference's are not "
            f"(or the other way round), first at {where}: got {out[where].item()}, expected "
            f"{ref[where].item()}"))
    result = Comparison(max_abs_err=read[3], max_rel_err=read[4])
    if n_bad:
        def outside(o: torch.Tensor, r: torch.Tensor) -> torch.Tensor:
            diff, rel = _errors(o, r, work, scale)
            return diff > 0 if exact else rel > tol

        where = unravel(first_where((out, ref), outside), out.shape)
        result.mismatch = Mismatch(
            Reason.WRONG_VALUES,
            f"{label}: {n_bad} of {out.numel()} elements are outside the {tol_name} "
            f"tolerance {tol:g} (relative to the reference's scale {read[5]:.4g}); worst "
            f"relative error {result.max_rel_err:.3g}, absolute {result.max_abs_err:.3g}; first "
            f"at {where}: got {out[where].item():.6g}, expected {ref[where].item():.6g}")
    return result


def compare_outputs(out: object, ref: object, tolerances: dict[torch.dtype, tuple[str, float]],
                    scales: list[torch.Tensor | None] | None = None) -> Comparison:
    """Compare every tensor of two (possibly nested) outputs; the first mismatch wins.
    `scales`: the reference's `reference_scales`, for a reference compared many times."""
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
        one = compare_tensor(index, o, r, tol, tol_name,
                             scales[index] if scales is not None else None)
        total.max_abs_err = max(total.max_abs_err, one.max_abs_err)
        total.max_rel_err = max(total.max_rel_err, one.max_rel_err)
        if one.mismatch:
            total.mismatch = one.mismatch
            return total
    return total
