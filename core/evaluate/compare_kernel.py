"""An output and its reference compared in one pass on a GPU: the counts and maxima
`correctness.compare_tensor` decides on, from one Triton kernel that reads each element of both
once.

The comparison in PyTorch ops takes some forty kernels a piece, each writing a temporary the size
of the piece: for a gigabyte output, tens of gigabytes of traffic on every timed call. Here each
program folds a stretch of the pair into five partials (unwritten elements, NaN/Inf mismatches,
elements outside the tolerance, the largest absolute and relative errors), and PyTorch reduces
the partials. The rules are `correctness`'s, element for element; where a count is not zero, the
caller goes back to PyTorch's ops to say where.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from core.evaluate.guard import FLOAT_POISON

BLOCK = 1024
BLOCKS_PER_PROGRAM = 16
# The partials' columns: three counts (unwritten, NaN/Inf mismatches, outside the tolerance),
# then two maxima (absolute and relative error).
COUNTS = 3
REL_CAP = tl.constexpr(1e30)  # as `correctness._errors` caps a relative error


@triton.jit
def _compare_kernel(out_ptr, ref_ptr, params_ptr, partial_ptr, n, poison,
                    BITS: tl.constexpr, WORK: tl.constexpr, BLOCK: tl.constexpr,
                    BLOCKS: tl.constexpr):
    program = tl.program_id(0)
    # In the work dtype, as PyTorch's ops hold them: the scale, the tolerance, the smallest
    # normal number.
    scale = tl.load(params_ptr + 0)
    tol = tl.load(params_ptr + 1)
    tiny = tl.load(params_ptr + 2)
    unwritten = tl.zeros([BLOCK], dtype=tl.int32)
    special = tl.zeros([BLOCK], dtype=tl.int32)
    bad = tl.zeros([BLOCK], dtype=tl.int32)
    max_abs = tl.zeros([BLOCK], dtype=WORK)
    max_rel = tl.zeros([BLOCK], dtype=WORK)
    for step in range(BLOCKS):
        offsets = (program * BLOCKS + step).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        inside = offsets < n
        o_raw = tl.load(out_ptr + offsets, mask=inside, other=0.0)
        r_raw = tl.load(ref_ptr + offsets, mask=inside, other=0.0)
        o_poisoned = o_raw.to(BITS, bitcast=True) == poison
        r_poisoned = r_raw.to(BITS, bitcast=True) == poison
        unwritten += (o_poisoned & (r_poisoned == 0) & inside).to(tl.int32)
        o = o_raw.to(WORK)
        r = r_raw.to(WORK)
        o_abs = tl.abs(o)
        r_abs = tl.abs(r)
        o_nan = o != o
        r_nan = r != r
        infinite = ((o_abs == float("inf")) | (r_abs == float("inf"))) & (o != r) & (
            (o_nan | r_nan) == 0)
        special += (((o_nan != r_nan) | infinite) & inside).to(tl.int32)
        finite = (o_abs < float("inf")) & (r_abs < float("inf"))
        diff = tl.where(finite, tl.abs(o - r), 0.0)
        ref_abs = tl.where(finite, r_abs, 0.0)
        rel = tl.minimum(diff / tl.maximum(scale + ref_abs, tiny), REL_CAP)
        bad += ((rel > tol) & inside).to(tl.int32)
        max_abs = tl.maximum(max_abs, diff)
        max_rel = tl.maximum(max_rel, rel)
    row = partial_ptr + program * 5
    tl.store(row + 0, tl.sum(unwritten, axis=0).to(tl.float64))
    tl.store(row + 1, tl.sum(special, axis=0).to(tl.float64))
    tl.store(row + 2, tl.sum(bad, axis=0).to(tl.float64))
    tl.store(row + 3, tl.max(max_abs, axis=0).to(tl.float64))
    tl.store(row + 4, tl.max(max_rel, axis=0).to(tl.float64))


_BITS = {torch.int64: tl.int64, torch.int32: tl.int32, torch.int16: tl.int16}


def fusable(out: torch.Tensor, ref: torch.Tensor) -> bool:
    """Whether the pair can be compared by the kernel: floating point of one poisoned dtype,
    the same shape, both contiguous and on one device."""
    return (out.dtype == ref.dtype and out.dtype in FLOAT_POISON and out.shape == ref.shape
            and out.device == ref.device and out.numel() > 0
            and out.is_contiguous() and ref.is_contiguous())


def compare_in_one_pass(out: torch.Tensor, ref: torch.Tensor, scale: torch.Tensor, tol: float
                        ) -> torch.Tensor:
    """Unwritten elements, NaN/Inf mismatches, elements outside `tol` relative to the reference's
    `scale` (a 0-dim tensor of the work dtype), the largest absolute and relative errors
    (`correctness.compare_tensor`'s rules), for a `fusable` pair: five float64 values on the
    device, in the order of the partials' columns."""
    bits, pattern = FLOAT_POISON[out.dtype]
    work = scale.dtype  # the comparison's work dtype (`correctness._work_dtype`)
    params = torch.stack([scale, torch.tensor(tol, dtype=work, device=out.device),
                          torch.tensor(torch.finfo(work).tiny, dtype=work, device=out.device)])
    programs = triton.cdiv(out.numel(), BLOCK * BLOCKS_PER_PROGRAM)
    partials = torch.empty((programs, 5), dtype=torch.float64, device=out.device)
    _compare_kernel[(programs,)](out.reshape(-1), ref.reshape(-1), params, partials, out.numel(),
                                 pattern, BITS=_BITS[bits],
                                 WORK=tl.float64 if work == torch.float64 else tl.float32,
                                 BLOCK=BLOCK, BLOCKS=BLOCKS_PER_PROGRAM)
    return torch.cat([partials[:, :COUNTS].sum(0), partials[:, COUNTS:].amax(0)])
