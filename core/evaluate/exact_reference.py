"""A second opinion for outputs that fail the tolerance: measured against the reference run in
fp64, is the candidate about as close to the exact answer as PyTorch itself?

Some outputs are rounding noise. The mean of a group-normalized tensor is zero in exact
arithmetic, so PyTorch's fp32 answer is a few ulps of the values it summed, and any other
correct order of summation lands elsewhere in that noise: the tolerance, relative to the
reference's own (tiny) scale, fails every correct kernel. Against fp64 such a kernel is as good
as PyTorch. The second opinion widens the tolerance only by a small multiple of the output's
rounding noise (PyTorch's own error, or how far the output moves when its inputs move by one
rounding), so on an output PyTorch computes accurately it changes nothing.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from core.evaluate.correctness import Comparison, flatten, pieces

# A candidate passes where it is no further from the fp64 answer than this many times
# PyTorch's own worst distance from it, plus the dtype's tolerance of the fp64 answer's scale.
# fp32 and fp64 are held to tight tolerances, which noise outputs fail; half precision's already
# spans its rounding, and a chain of half-precision roundings can put PyTorch's own answer far
# from fp64, so a half-precision output may be only as far from it as PyTorch's (a kernel that
# accumulates in fp32 is nearer: a bf16 flash attention's worst element sat 1.03 tolerances from
# PyTorch's bf16 answer).
AS_CLOSE_AS = {torch.float32: 4.0, torch.float64: 4.0, torch.bfloat16: 1.0, torch.float16: 1.0}
FULL_PRECISION = {dtype: AS_CLOSE_AS[dtype] for dtype in (torch.float32, torch.float64)}


@dataclass
class ExactAnswer:
    """The reference's outputs in fp64, and in its own precision on inputs each moved by one
    rounding (how far the output moves with the rounding any implementation meets)."""

    exact: object
    wobbled: object


def exact_answer(model: torch.nn.Module, inputs: Sequence[object], seed: int = 0
                 ) -> ExactAnswer:
    """`model`'s outputs in fp64 (a copy of it, and its floating inputs, in float64), and on
    its floating inputs each times 1 ± one unit of their precision's rounding."""
    exact_model = copy.deepcopy(model).double()
    floating = [isinstance(t, torch.Tensor) and t.is_floating_point() for t in inputs]
    with torch.no_grad():
        exact = exact_model(*[t.double() if f else t for t, f in zip(inputs, floating,
                                                                     strict=True)])
        del exact_model
        wobbled = model(*[wobble(t, seed + i) if f else t
                          for i, (t, f) in enumerate(zip(inputs, floating, strict=True))])
    return ExactAnswer(exact, wobbled)


def exact_bytes(model: torch.nn.Module, inputs: Sequence[object], output: object) -> int:
    """The device bytes `exact_answer` takes beyond what is held already, at its peak: the
    model's copy and its fp64 version, the floating inputs in fp64 and the fp64 answer; then,
    beside that answer, the inputs moved by one rounding (their signs, two temporaries of
    `wobble`'s arithmetic and the result) and their answer."""
    weights = [t for t in [*model.parameters(), *model.buffers()] if t.is_floating_point()]
    floating = [t for t in inputs if isinstance(t, torch.Tensor) and t.is_floating_point()]
    outputs = [t for t in flatten(output) if isinstance(t, torch.Tensor)]
    copied = sum(t.numel() * (t.element_size() + 8) for t in weights)
    exact_out = sum(t.numel() * 8 for t in outputs)
    first = copied + sum(t.numel() * 8 for t in floating) + exact_out
    second = exact_out + sum(t.numel() * (3 * t.element_size() + 1) for t in floating) + sum(
        t.numel() * t.element_size() for t in outputs)
    return max(first, second)


def no_room_for_exact(model: torch.nn.Module, inputs: Sequence[object], output: object,
                      device: torch.device) -> str | None:
    """Why the fp64 answer cannot be made on `device` now (it would not fit in the memory the
    GPU has free: trying would take what other judges' candidates hold, then fail), or None."""
    if device.type != "cuda":
        return None
    needed = exact_bytes(model, inputs, output)
    free, _ = torch.cuda.mem_get_info(device)
    if needed <= free:
        return None
    return (f"it would need {needed / 1e9:.2f} GB of device memory, "
            f"{free / 1e9:.2f} GB are free")


def wobble(t: torch.Tensor, seed: int) -> torch.Tensor:
    """`t` with each element times 1 ± eps of its dtype, the signs drawn on its device."""
    generator = torch.Generator(device=t.device).manual_seed(seed)
    signs = torch.randint(0, 2, t.shape, generator=generator, device=t.device,
                          dtype=torch.int8)
    return t * (1 + torch.finfo(t.dtype).eps * (signs.to(t.dtype) * 2 - 1))


def distance(a: torch.Tensor, b: torch.Tensor) -> float:
    """The largest |a - b| over the elements finite in both, a piece at a time, in fp64."""
    worst = 0.0
    for _, (x, y) in pieces(a, b.to(a.device)):
        x, y = x.double(), y.double()
        both = x.isfinite() & y.isfinite()
        worst = max(worst, float(torch.where(both, (x - y).abs(), 0).max()))
    return worst


def largest_magnitude(t: torch.Tensor) -> float:
    """The largest finite |t|, a piece at a time."""
    worst = 0.0
    for _, (x,) in pieces(t):
        x = x.double()
        worst = max(worst, float(torch.where(x.isfinite(), x.abs(), 0).max()))
    return worst


def as_close_as_pytorch(out: object, ref: object, answer: ExactAnswer,
                        tolerances: dict[torch.dtype, tuple[str, float]],
                        factors: dict[torch.dtype, float] = AS_CLOSE_AS) -> Comparison | None:
    """The comparison against fp64 when every floating output of `out` is about as close to
    the exact answer as `ref` (PyTorch's) is, and every other output equals `ref`'s; None when
    some output is not, or has a dtype `factors` leaves out. About as close: within
    `factors[dtype]` times the larger of PyTorch's own distance and how far the output moves
    when the inputs move by one rounding (PyTorch's own distance can be small by luck), plus
    the tolerance of the exact answer's scale."""
    outs, refs = flatten(out), flatten(ref)
    exacts, wobbled = flatten(answer.exact), flatten(answer.wobbled)
    if not len(outs) == len(refs) == len(exacts) == len(wobbled):
        return None
    result = Comparison()
    for o, r, e, w in zip(outs, refs, exacts, wobbled, strict=True):
        if not isinstance(r, torch.Tensor):
            continue  # compared exactly already: only values' tolerances are in question
        if not (isinstance(o, torch.Tensor) and isinstance(e, torch.Tensor)
                and o.shape == r.shape == e.shape):
            return None
        if not r.is_floating_point():
            if not torch.equal(o.to(r.device), r):
                return None
            continue
        if r.dtype not in factors:
            return None
        if r.numel() == 0:
            continue
        _, tol = tolerances.get(r.dtype, ("exact", 0.0))
        scale = largest_magnitude(e)
        noise = max(distance(r, e), distance(w, r)) if isinstance(w, torch.Tensor) else \
            distance(r, e)
        error = distance(o, e)
        if error > factors[r.dtype] * noise + tol * scale:
            return None
        result.max_abs_err = max(result.max_abs_err, error)
        result.max_rel_err = max(result.max_rel_err, error / max(scale, 1e-300))
    return result
