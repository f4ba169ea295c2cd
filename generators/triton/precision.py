"""How the fp32 operands of a Triton `tl.dot` are multiplied.

- "ieee": exactly, on the CUDA cores (H200: 50.7 TFLOP/s, bench/NOTES.md, Ceilings);
- "tf32x3": each operand split into a tf32 high part and a tf32 remainder, three tensor-core
  products summed in fp32: fp32's accuracy at a few times its speed, so it is held to fp32's
  tolerance and competes with PyTorch's fp32 matmul fairly;
- "tf32": one tensor-core product with 10-bit mantissas, a different answer than fp32; only for
  runs that allow TF32 for their baselines too.
"""

from __future__ import annotations

import torch

PRECISIONS = ("ieee", "tf32x3", "tf32")
DESCRIBED = {"ieee": "", "tf32x3": ", fp32 as three tf32 products", "tf32": ", tf32"}


def check_precision(precision: str) -> None:
    if precision not in PRECISIONS:
        raise ValueError(f"precision {precision!r} is not one of {PRECISIONS}")


def dot_precision(dtype: torch.dtype, precision: str) -> str:
    """The `input_precision` argument of `tl.dot` for operands of `dtype` (none for 16-bit
    operands, which the tensor cores multiply exactly)."""
    check_precision(precision)
    return f', input_precision="{precision}"' if dtype == torch.float32 else ""
