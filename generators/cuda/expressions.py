"""Elementwise ops as CUDA C++ float expressions, and the device helpers they and the loads need.

The CUDA twin of `generators.triton.expressions`: the same ops, the same fp32 arithmetic whatever
the tensors' dtype, and NaN behaving as in PyTorch (`relu(nan)` and `maximum(nan, 1)` are nan).
Every value lives in a `float` register; booleans are 0.0 or 1.0. Half and bfloat16 travel as their
raw 16 bits and convert through PTX, so the sources need no headers (they are compiled inside
`extern "C"`, where the templates of `cuda_fp16.h` cannot live).
"""

from __future__ import annotations

import math

import torch

from generators.codegen import BINARY_OPERATORS, COMPARISONS, arg, arg_at
from generators.site_graph import Op, Ref, Unsupported
from generators.triton.expressions import GELU_EXP2_CUBIC, GELU_EXP2_SCALE

SQRT1_2 = 0.7071067811865476
SQRT_2_OVER_PI = 0.7978845608028654

# How each dtype is stored in memory, and how one element of it becomes a float and back.
STORAGE = {
    torch.float32: "float",
    torch.float16: "unsigned short",
    torch.bfloat16: "unsigned short",
    torch.bool: "unsigned char",
}
_LOAD = {
    torch.float32: "{}",
    torch.float16: "half_to_float({})",
    torch.bfloat16: "bf16_to_float({})",
    torch.bool: "(float)({})",
}
_STORE = {
    torch.float32: "{}",
    torch.float16: "float_to_half({})",
    torch.bfloat16: "float_to_bf16({})",
    torch.bool: "(unsigned char)(({}) != 0.0f)",
}

HELPERS = r"""
__device__ __forceinline__ float half_to_float(unsigned short bits) {
    float value;
    asm("cvt.f32.f16 %0, %1;" : "=f"(value) : "h"(bits));
    return value;
}

__device__ __forceinline__ unsigned short float_to_half(float value) {
    unsigned short bits;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(bits) : "f"(value));
    return bits;
}

__device__ __forceinline__ float bf16_to_float(unsigned short bits) {
    return __uint_as_float(((unsigned int)bits) << 16);
}

__device__ __forceinline__ unsigned short float_to_bf16(float value) {
    unsigned short bits;
    asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(bits) : "f"(value));
    return bits;
}

// fmaxf/fminf drop a NaN operand; PyTorch's maximum/minimum/amax propagate it.
__device__ __forceinline__ float nan_max(float a, float b) {
    return (a != a || b != b) ? __int_as_float(0x7fffffff) : fmaxf(a, b);
}

__device__ __forceinline__ float nan_min(float a, float b) {
    return (a != a || b != b) ? __int_as_float(0x7fffffff) : fminf(a, b);
}

// The hardware exp2 and reciprocal, 2 ulp or better (a few 1e-6 relative at |x| near 80,
// against the 1e-4 fp32 tolerance); the IEEE division and expf put a slow-path call in every
// element (the sm_90 cluster group norm + silu kernel: 1184 instructions, 928 with these).
// For x below -87 the denominator passes 2^126 and the quotient flushes to 0, its limit.
__device__ __forceinline__ float sigmoid(float x) {
    return __fdividef(1.0f, 1.0f + __expf(-x));
}
"""


def storage_type(dtype: torch.dtype) -> str:
    if dtype not in STORAGE:
        raise Unsupported(f"no CUDA storage rule for {dtype}: the CUDA rules handle float32, "
                          "float16, bfloat16 and bool")
    return STORAGE[dtype]


def load_as_float(dtype: torch.dtype, element: str) -> str:
    """The float value of `element`, a stored element of `dtype`."""
    storage_type(dtype)
    return _LOAD[dtype].format(element)


def store_from_float(dtype: torch.dtype, value: str) -> str:
    """`value` (a float) converted to how `dtype` is stored, rounding to nearest even."""
    storage_type(dtype)
    return _STORE[dtype].format(value)


def _const(value: object) -> str:
    if isinstance(value, bool):
        return "1.0f" if value else "0.0f"
    if isinstance(value, int | float):
        if math.isnan(value):
            return "__int_as_float(0x7fffffff)"
        if math.isinf(value):
            return "__int_as_float(0x7f800000)" if value > 0 else "__int_as_float(0xff800000)"
        return f"{float(value)!r}f"
    raise Unsupported(f"constant {value!r} in an elementwise op")


def _select(condition: str, yes: str, no: str) -> str:
    return f"(({condition}) ? ({yes}) : ({no}))"


def _pow(base: str, exponent: object) -> str:
    if isinstance(exponent, int | float) and float(exponent).is_integer() and abs(exponent) <= 4:
        k = int(exponent)
        if k == 0:
            return f"({base} * 0.0f + 1.0f)"
        product = " * ".join([base] * abs(k))
        return f"({product})" if k > 0 else f"(1.0f / ({product}))"
    if exponent == 0.5:
        return f"sqrtf({base})"
    return f"powf({base}, {_const(exponent)})"


def _round_through(dtype: torch.dtype, x: str) -> str:
    """`x` rounded to `dtype` and back to float, as a PyTorch cast in the middle of a chain."""
    if dtype == torch.float16:
        return f"half_to_float(float_to_half({x}))"
    if dtype == torch.bfloat16:
        return f"bf16_to_float(float_to_bf16({x}))"
    if dtype == torch.float32:
        return x
    raise Unsupported(f"a cast to {dtype} inside the chain")


def cuda_elementwise(op: Op, value: dict[Ref, str]) -> str:
    """The CUDA float expression of `op`; `value` names each Ref already in registers."""

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
        quotient = f"({x} / {v(a(1))})"
        if op.kwarg("rounding_mode") == "floor":
            return f"floorf{quotient}"
        return f"truncf{quotient}"
    if name in binary:
        return f"({x} {binary[name]} {v(a(1))})"
    if name == "rsub":
        return f"({v(a(1))} - {x})"
    if name in compare:
        return _select(f"{x} {compare[name]} {v(a(1))}", "1.0f", "0.0f")
    unary = {
        "neg": f"(-{x})", "negative": f"(-{x})", "abs": f"fabsf({x})", "exp": f"expf({x})",
        "log": f"logf({x})", "sqrt": f"sqrtf({x})", "rsqrt": f"rsqrtf({x})",
        "reciprocal": f"(1.0f / {x})", "square": f"({x} * {x})", "sigmoid": f"sigmoid({x})",
        "tanh": f"tanhf({x})", "silu": f"({x} * sigmoid({x}))", "sin": f"sinf({x})",
        "cos": f"cosf({x})", "erf": f"erff({x})", "exp2": f"exp2f({x})",
        "log2": f"log2f({x})", "log1p": f"log1pf({x})", "expm1": f"expm1f({x})",
        "floor": f"floorf({x})", "ceil": f"ceilf({x})",
        "relu": _select(f"{x} < 0.0f", "0.0f", x),
        "relu6": _select(f"{x} < 0.0f", "0.0f", _select(f"{x} > 6.0f", "6.0f", x)),
        "hardsigmoid": f"fminf(fmaxf({x} / 6.0f + 0.5f, 0.0f), 1.0f)",
        "hardswish": f"({x} * fminf(fmaxf({x} / 6.0f + 0.5f, 0.0f), 1.0f))",
        "mish": f"({x} * tanhf(log1pf(expf({x}))))",
        "logsigmoid": f"(-log1pf(expf(-{x})))",
        "softsign": f"({x} / (1.0f + fabsf({x})))",
        "logical_not": _select(f"{x} == 0.0f", "1.0f", "0.0f"),
        "bitwise_not": _select(f"{x} == 0.0f", "1.0f", "0.0f"),
        "float": x, "half": x, "bfloat16": x, "double": x, "to": x, "type_as": x,
    }
    if name in unary:
        if name in ("float", "half", "bfloat16", "to", "type_as") and \
                op.out.dtype.is_floating_point:
            return _round_through(op.out.dtype, x)
        return unary[name]
    if name == "gelu":
        if op.kwarg("approximate", "none") == "tanh":
            inner = f"{SQRT_2_OVER_PI}f * ({x} + 0.044715f * {x} * {x} * {x})"
            return f"(0.5f * {x} * (1.0f + tanhf({inner})))"
        if op.out.dtype == torch.bfloat16:
            # The tanh form for a result rounded to bf16 (generators.triton.expressions says why).
            exponent = f"{x} * (-{GELU_EXP2_SCALE!r}f - {GELU_EXP2_CUBIC!r}f * {x} * {x})"
            return f"({x} / (1.0f + exp2f({exponent})))"
        return f"(0.5f * {x} * (1.0f + erff({x} * {SQRT1_2}f)))"
    if name == "pow":
        if isinstance(a(0), Ref) and not isinstance(a(1), Ref):
            return _pow(x, a(1))
        raise Unsupported("pow with a tensor exponent")
    if name in ("clamp", "clip", "hardtanh"):
        low, high = kw("min", 1, None), kw("max", 2, None)
        if name == "hardtanh":
            low, high = kw("min_val", 1, -1.0), kw("max_val", 2, 1.0)
        result = x
        if low is not None:
            result = _select(f"{result} < {v(low)}", v(low), result)
        if high is not None:
            result = _select(f"{result} > {v(high)}", v(high), result)
        return result
    if name in ("clamp_min", "clamp_max"):
        bound = v(a(1))
        cmp = "<" if name == "clamp_min" else ">"
        return _select(f"{x} {cmp} {bound}", bound, x)
    if name in ("maximum", "minimum"):
        return f"nan_{name[:3]}({x}, {v(a(1))})"
    if name == "leaky_relu":
        return _select(f"{x} >= 0.0f", x, f"{x} * {_const(kw('negative_slope', 1, 0.01))}")
    if name == "elu":
        alpha = _const(kw("alpha", 1, 1.0))
        return _select(f"{x} > 0.0f", x, f"{alpha} * expm1f({x})")
    if name == "softplus":
        beta, threshold = _const(kw("beta", 1, 1.0)), _const(kw("threshold", 2, 20.0))
        return _select(f"{x} * {beta} > {threshold}", x, f"log1pf(expf({x} * {beta})) / {beta}")
    if name == "where":
        return _select(f"{v(a(0))} != 0.0f", v(a(1)), v(a(2)))
    if name == "masked_fill":
        return _select(f"{v(a(1))} != 0.0f", v(a(2)), x)
    if name in ("dropout", "identity", "detach", "view", "reshape", "flatten", "unsqueeze",
                "squeeze", "unflatten", "contiguous"):
        return x
    if name == "batch_norm":
        mean, var, weight, bias = (a(i) for i in (1, 2, 3, 4))
        eps = _const(kw("eps", 7, 1e-5))
        result = f"(({x} - {v(mean)}) * rsqrtf({v(var)} + {eps}))"
        if weight is not None:
            result = f"({result} * {v(weight)})"
        if bias is not None:
            result = f"({result} + {v(bias)})"
        return result
    raise Unsupported(f"no elementwise rule for {name}")
