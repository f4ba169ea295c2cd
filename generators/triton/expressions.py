"""Elementwise ops as Triton expressions, computed in fp32 whatever the tensors' dtype.

Every pointwise chain, epilogue and prologue the rules generator writes goes through here, so
an op's formula lives in one place. NaN behaves as in PyTorch (`relu(nan)` is nan).
"""

from __future__ import annotations

import math

import torch

from generators.codegen import BINARY_OPERATORS, COMPARISONS, arg, arg_at
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
SQRT_2_OVER_PI = 0.7978845608028654
# The tanh-form GELU's exponent is -(x * GELU_EXP2_SCALE + x^3 * GELU_EXP2_CUBIC):
# 2 sqrt(2/pi) log2(e) (x + 0.044715 x^3).
GELU_EXP2_SCALE = 2.0 * SQRT_2_OVER_PI * math.log2(math.e)
GELU_EXP2_CUBIC = GELU_EXP2_SCALE * 0.044715

# Exact (erf) GELU through Abramowitz & Stegun 7.1.26, written for x / sqrt(2) with its
# constants folded. Against float64 its error is under 4.7e-7 absolute, about what PyTorch's
# fp32 GELU has (3.8e-7). It compiles to 30 instructions per element of bias + GELU on sm_90
# against 42 with libdevice's erff, which made that site issue-bound at 60 % of its byte floor.
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
# units off near x = -0.9, so fp16 keeps the exact form. Bias + GELU 8192² bf16 went from
# 0.0739 to 0.0645 ms on an H200, 84 % to 97 % of its byte floor: the exact form's 30
# instructions an element had made it issue-bound.
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


def _const(value: object) -> str:
    if isinstance(value, bool):
        return "1.0" if value else "0.0"
    if isinstance(value, int | float):
        if math.isinf(value):
            return "float('inf')" if value > 0 else "float('-inf')"
        return repr(float(value))
    raise Unsupported(f"constant {value!r} in an elementwise op")


def _tanh(x: str) -> str:
    return f"(2.0 * tl.sigmoid(2.0 * {x}) - 1.0)"


def _pow(base: str, exponent: object) -> str:
    if isinstance(exponent, int | float) and float(exponent).is_integer() and abs(exponent) <= 4:
        k = int(exponent)
        if k == 0:
            return f"({base} * 0.0 + 1.0)"
        product = " * ".join([base] * abs(k))
        return f"({product})" if k > 0 else f"(1.0 / ({product}))"
    if exponent == 0.5:
        return f"tl.sqrt_rn({base})"
    return f"tl.exp({_const(exponent)} * tl.log({base}))"


def elementwise(op: Op, value: dict[Ref, str]) -> str:
    """The Triton expression of `op`; `value` names each Ref already in registers (fp32)."""

    def a(i: int, default: object = None) -> object:
        return arg_at(op, i, default)

    def v(x: object) -> str:
        return value[x] if isinstance(x, Ref) else _const(x)

    def kw(name: str, position: int, default: object) -> object:
        return arg(op, name, position, default)

    name = op.name
    x = v(a(0)) if op.args else ""
    binary, compare = BINARY_OPERATORS, COMPARISONS
    if name in ("add", "sub") and kw("alpha", 2, 1) != 1:
        return f"({x} {binary[name]} {_const(kw('alpha', 2, 1))} * {v(a(1))})"
    if name in ("div", "divide") and op.kwarg("rounding_mode") is not None:
        mode = op.kwarg("rounding_mode")
        quotient = f"({x} / {v(a(1))})"
        if mode == "floor":
            return f"tl.floor({quotient})"
        return f"tl.where({quotient} < 0.0, tl.ceil({quotient}), tl.floor({quotient}))"
    if name in binary:
        return f"({x} {binary[name]} {v(a(1))})"
    if name == "rsub":
        return f"({v(a(1))} - {x})"
    if name in compare:
        return f"({x} {compare[name]} {v(a(1))})"
    unary = {
        "neg": f"(-{x})", "negative": f"(-{x})", "abs": f"tl.abs({x})", "exp": f"tl.exp({x})",
        "log": f"tl.log({x})", "sqrt": f"tl.sqrt_rn({x})", "rsqrt": f"tl.rsqrt({x})",
        "reciprocal": f"(1.0 / {x})", "square": f"({x} * {x})", "sigmoid": f"tl.sigmoid({x})",
        "tanh": _tanh(x), "silu": f"({x} * tl.sigmoid({x}))", "sin": f"tl.sin({x})",
        "cos": f"tl.cos({x})", "erf": f"tl.erf({x})", "exp2": f"tl.exp2({x})",
        "log2": f"tl.log2({x})", "log1p": f"tl.log(1.0 + {x})", "expm1": f"(tl.exp({x}) - 1.0)",
        "floor": f"tl.floor({x})", "ceil": f"tl.ceil({x})",
        "relu": f"tl.where({x} < 0.0, 0.0, {x})",
        "relu6": f"tl.where({x} < 0.0, 0.0, tl.where({x} > 6.0, 6.0, {x}))",
        "hardsigmoid": f"tl.minimum(tl.maximum({x} / 6.0 + 0.5, 0.0), 1.0)",
        "hardswish": f"({x} * tl.minimum(tl.maximum({x} / 6.0 + 0.5, 0.0), 1.0))",
        "mish": f"({x} * {_tanh(f'tl.log(1.0 + tl.exp({x}))')})",
        "logsigmoid": f"(-tl.log(1.0 + tl.exp(-{x})))",
        "softsign": f"({x} / (1.0 + tl.abs({x})))",
        "logical_not": f"({x} == 0)",
        "bitwise_not": f"({x} == 0)",
        "float": x, "half": x, "bfloat16": x, "double": x, "to": x, "type_as": x,
    }
    if name in unary:
        casts = ("float", "half", "bfloat16", "to", "type_as")
        if name in casts and op.out.dtype.is_floating_point:
            # Round through the target dtype, as PyTorch does, then keep computing in fp32.
            return f"{x}.to({tl_dtype(op.out.dtype)}).to(tl.float32)"
        return unary[name]
    if name == "gelu":
        if op.kwarg("approximate", "none") == "tanh":
            inner = f"{SQRT_2_OVER_PI} * ({x} + 0.044715 * {x} * {x} * {x})"
            return f"(0.5 * {x} * (1.0 + {_tanh(inner)}))"
        return f"gelu_bf16({x})" if op.out.dtype == torch.bfloat16 else f"gelu_exact({x})"
    if name == "pow":
        if isinstance(a(0), Ref) and not isinstance(a(1), Ref):
            return _pow(x, a(1))
        raise Unsupported("pow with a tensor exponent")
    if name in ("clamp", "clip", "hardtanh"):
        low = kw("min", 1, -1.0 if name == "hardtanh" else None)
        high = kw("max", 2, 1.0 if name == "hardtanh" else None)
        if name == "hardtanh":
            low, high = kw("min_val", 1, -1.0), kw("max_val", 2, 1.0)
        result = x
        if low is not None:
            result = f"tl.where({result} < {v(low)}, {v(low)}, {result})"
        if high is not None:
            result = f"tl.where({result} > {v(high)}, {v(high)}, {result})"
        return result
    if name in ("clamp_min", "clamp_max"):
        bound = v(a(1))
        cmp = "<" if name == "clamp_min" else ">"
        return f"tl.where({x} {cmp} {bound}, {bound}, {x})"
    if name in ("maximum", "minimum"):
        return f"tl.{name}({x}, {v(a(1))})"
    if name == "leaky_relu":
        return f"tl.where({x} >= 0.0, {x}, {x} * {_const(kw('negative_slope', 1, 0.01))})"
    if name == "elu":
        alpha = _const(kw("alpha", 1, 1.0))
        return f"tl.where({x} > 0.0, {x}, {alpha} * (tl.exp({x}) - 1.0))"
    if name == "softplus":
        beta, threshold = _const(kw("beta", 1, 1.0)), _const(kw("threshold", 2, 20.0))
        return (f"tl.where({x} * {beta} > {threshold}, {x}, "
                f"tl.log(1.0 + tl.exp({x} * {beta})) / {beta})")
    if name == "where":
        return f"tl.where({v(a(0))} != 0, {v(a(1))}, {v(a(2))})"
    if name == "masked_fill":
        return f"tl.where({v(a(1))} != 0, {v(a(2))}, {x})"
    if name in ("dropout", "identity", "detach", "view", "reshape", "flatten", "unsqueeze",
                "squeeze", "unflatten", "contiguous"):
        return x
    if name == "batch_norm":
        mean, var, weight, bias = (a(i) for i in (1, 2, 3, 4))
        eps = _const(kw("eps", 7, 1e-5))
        result = f"(({x} - {v(mean)}) * tl.rsqrt({v(var)} + {eps}))"
        if weight is not None:
            result = f"({result} * {v(weight)})"
        if bias is not None:
            result = f"({result} + {v(bias)})"
        return result
    raise Unsupported(f"no elementwise rule for {name}")


def channel_aligned_inputs(op: Op) -> list[Ref]:
    """Inputs an op broadcasts along dimension 1 rather than the trailing one (batch norm)."""
    if op.name != "batch_norm":
        return []
    params = [r for r in op.args[1:5] if isinstance(r, Ref)]
    if any(not r.is_input for r in params):
        # A statistic computed inside the site has the channel shape but would be indexed
        # like the output's trailing dimension.
        raise Unsupported("batch norm statistics computed inside the site")
    return params
