"""A second opinion for outputs that fail the tolerance: measured against the reference run in
fp64, is the candidate about as close to the exact answer as PyTorch itself?

Some outputs are rounding noise. The mean of a group-normalized tensor is zero in exact
arithmetic, so PyTorch's fp32 answer is a few ulps of the values it summed, and any other
correct order of summation lands elsewhere in that noise: the tolerance, relative to the
reference's own (tiny) scale, fails every correct kernel. Against fp64 such a kernel is as good
as PyTorch. The second opinion widens the tolerance only by a small multiple of PyTorch's own
worst error on the output, so on an output PyTorch computes accurately it changes nothing.
Only fp32 and fp64 outputs get one.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence

import torch

from core.evaluate.correctness import Comparison, flatten, pieces

# A candidate passes where it is no further from the fp64 answer than this many times
# PyTorch's own worst distance from it, plus the dtype's tolerance of the fp64 answer's scale.
AS_CLOSE_AS = 4.0
# Half precision's tolerance already spans its rounding, and a chain of half-precision roundings
# can put PyTorch's own answer far from fp64: a multiple of that distance would pass wrong
# kernels. Only fp32 and fp64 outputs, held to tight tolerances, get a second opinion.
SECOND_OPINION_DTYPES = (torch.float32, torch.float64)


def fp64_outputs(model: torch.nn.Module, inputs: Sequence[object]) -> object:
    """`model`'s outputs in fp64: a copy of it, and its floating inputs, in float64."""
    exact_model = copy.deepcopy(model).double()
    exact_inputs = [t.double() if isinstance(t, torch.Tensor) and t.is_floating_point() else t
                    for t in inputs]
    with torch.no_grad():
        return exact_model(*exact_inputs)


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


def as_close_as_pytorch(out: object, ref: object, exact: object,
                        tolerances: dict[torch.dtype, tuple[str, float]]) -> Comparison | None:
    """The comparison against fp64 when every floating output of `out` is as close to `exact`
    as `ref` (PyTorch's) is (within AS_CLOSE_AS times, plus the tolerance of its scale) and
    every other output equals `ref`'s; None when some output is not."""
    outs, refs, exacts = flatten(out), flatten(ref), flatten(exact)
    if not len(outs) == len(refs) == len(exacts):
        return None
    result = Comparison()
    for o, r, e in zip(outs, refs, exacts, strict=True):
        if not isinstance(r, torch.Tensor):
            continue  # compared exactly already: only values' tolerances are in question
        if not (isinstance(o, torch.Tensor) and isinstance(e, torch.Tensor)
                and o.shape == r.shape == e.shape):
            return None
        if not r.is_floating_point():
            if not torch.equal(o.to(r.device), r):
                return None
            continue
        if r.dtype not in SECOND_OPINION_DTYPES:
            return None
        if r.numel() == 0:
            continue
        _, tol = tolerances.get(r.dtype, ("exact", 0.0))
        scale = largest_magnitude(e)
        pytorch_error, error = distance(r, e), distance(o, e)
        if error > AS_CLOSE_AS * pytorch_error + tol * scale:
            return None
        result.max_abs_err = max(result.max_abs_err, error)
        result.max_rel_err = max(result.max_rel_err, error / max(scale, 1e-300))
    return result
