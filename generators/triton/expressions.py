"""Elementwise ops in Triton: the op table's formulas written as Triton expressions (fp32
whatever the tensors' dtype), the `@triton.jit` helpers they call, and Triton's dtype names.

Every pointwise chain, epilogue and prologue the rules generator writes in Triton goes through
here; the formulas themselves are `generators.op_table`'s.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from generators.op_table import GELU_EXP2_CUBIC, GELU_EXP2_SCALE, formula
from generators.site_graph import Op, Ref, Unsupported

_TL_DTYPES = {
    torch.float32: "tl.float32",
    torch.float16: "tl.float16",
    torch.bfloat16: "tl.bfloat16",
    torch.float64: "tl.float64",
    torch.bool: "tl.int1",
    torch.int32: "tl.int32",
    torch.int64: "tl.int64",
}
# Exact (erf) GELU through Abramowitz & Stegun 7.1.26, written for x / sqrt(2) with its
# constants folded. Against float64 its error is under 4.7e-7 absolute, about what PyTorch's
# fp32 GELU has (3.8e-7). It compiles to fewer instructions an element than libdevice's erff,
# whose count had made bias + GELU issue-bound on sm_90 (bench/NOTES.md, 2026-12-03).
GELU_EXACT_HELPER = '''@triton.jit
def gelu_exact(x):
    """x * Phi(x), with erf(|x| / sqrt(2)) = 1 - t * p(t) * exp(-x^2 / 2)."""
    a = tl.abs(x)
    t = tl.fdiv(1.0, 1.0 + 0.2316418980 * a, ieee_rounding=False)
    p = ((((1.061405429 * t - 1.453152027) * t + 1.421413741) * t - 0.284496736) * t
         + 0.254829592) * t
    erf_abs = 1.0 - p * tl.exp2(x * x * -0.7213475204444817)
    return 0.5 * (x + a * erf_abs)
'''
# A GELU whose result PyTorch rounds to bfloat16 is taken in the tanh form, written as
# x * sigmoid(2u) = x / (1 + 2^(-2u log2 e)), u = sqrt(2/pi) (x + 0.044715 x^3): one exp2 and
# one division. Its error against the exact GELU is at most 4.7e-4 absolute (at x = 2.7), so a
# bf16 result is at most one unit from PyTorch's wherever |GELU| >= 0.05, and within 4.7e-4 of
# it below (bf16's unit at 0.06 is 4.9e-4). In fp16, three bits finer, it would be up to four
# units off near x = -0.9, so fp16 keeps the exact form. The exact form's instructions had made
# bias + GELU in bf16 issue-bound; this one brought it near its byte floor (bench/NOTES.md,
# fifth round).
GELU_BF16_HELPER = f'''@triton.jit
def gelu_bf16(x):
    """x * sigmoid(2 * sqrt(2 / pi) * (x + 0.044715 * x^3)), for a result rounded to bf16."""
    return tl.fdiv(x, 1.0 + tl.exp2(x * (-{GELU_EXP2_SCALE!r} - {GELU_EXP2_CUBIC!r} * x * x)),
                   ieee_rounding=False)
'''
JIT_HELPERS = {"gelu_exact": GELU_EXACT_HELPER, "gelu_bf16": GELU_BF16_HELPER}
_KERNEL_IMPORTS = "import triton.language as tl\n"


def with_jit_helpers(source: str) -> str:
    """`source` with the `@triton.jit` helpers its kernels call defined after its imports."""
    needed = [text for name, text in JIT_HELPERS.items()
              if f"{name}(" in source and f"def {name}(" not in source]
    if not needed:
        return source
    if _KERNEL_IMPORTS not in source:
        raise ValueError("a Triton kernel source without `import triton.language as tl`")
    return source.replace(_KERNEL_IMPORTS, _KERNEL_IMPORTS + "\n\n" + "\n\n".join(needed), 1)


def tl_dtype(dtype: torch.dtype) -> str:
    if dtype not in _TL_DTYPES:
        raise Unsupported(f"no Triton type for {dtype}")
    return _TL_DTYPES[dtype]


class TritonEmitter:
    """How a formula of `generators.op_table` is written in Triton."""

    def const(self, value: float) -> str:
        if math.isnan(value):
            return "float('nan')"
        if math.isinf(value):
            return "float('inf')" if value > 0 else "float('-inf')"
        return repr(float(value))

    def call(self, function: str, *args: str) -> str:
        return _FUNCTIONS[function](*args)

    def select(self, condition: str, yes: str, no: str) -> str:
        return f"tl.where({condition}, {yes}, {no})"

    def truth(self, condition: str) -> str:
        return f"({condition})"

    def nonzero(self, value: str) -> str:
        return f"{value} != 0"

    def round_to(self, dtype: torch.dtype, value: str) -> str:
        return f"({value}).to({tl_dtype(dtype)}).to(tl.float32)"


_NAN_ALL = "propagate_nan=tl.PropagateNan.ALL"
_FUNCTIONS: dict[str, Callable[..., str]] = {
    **{name: (lambda x, name=name: f"tl.{name}({x})")
       for name in ("abs", "exp", "exp2", "log", "log2", "rsqrt", "sin", "cos", "erf",
                    "sigmoid", "floor", "ceil")},
    "sqrt": lambda x: f"tl.sqrt_rn({x})",
    "expm1": lambda x: f"(tl.exp({x}) - 1.0)",
    "log1p": lambda x: f"tl.log(1.0 + {x})",
    "tanh": lambda x: f"(2.0 * tl.sigmoid(2.0 * ({x})) - 1.0)",
    "trunc": lambda x: f"tl.where({x} < 0.0, tl.ceil({x}), tl.floor({x}))",
    "maximum": lambda x, y: f"tl.maximum({x}, {y}, {_NAN_ALL})",
    "minimum": lambda x, y: f"tl.minimum({x}, {y}, {_NAN_ALL})",
    "pow": lambda base, exponent: f"tl.exp({exponent} * tl.log({base}))",
    "gelu_exact": lambda x: f"gelu_exact({x})",
    "gelu_bf16": lambda x: f"gelu_bf16({x})",
}
TRITON = TritonEmitter()


def elementwise(op: Op, value: dict[Ref, str]) -> str:
    """The Triton expression of `op`; `value` names each Ref already in registers (fp32)."""
    return formula(op, value, TRITON)
