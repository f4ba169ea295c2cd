"""Elementwise ops in CUDA C++: the op table's formulas written as float expressions, the device
helpers they and the loads need, and how each dtype is stored.

The CUDA twin of `generators.triton.expressions`, from the same `generators.op_table` formulas: fp32
arithmetic whatever the tensors' dtype, and NaN behaving as in PyTorch (`relu(nan)` and
`maximum(nan, 1)` are nan). Every value lives in a `float` register; booleans are 0.0 or 1.0. Half
and bfloat16 travel as their raw 16 bits and convert through PTX, so the sources need no headers
(they are compiled inside `extern "C"`, where the templates of `cuda_fp16.h` cannot live).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from generators.op_table import GELU_EXP2_CUBIC, GELU_EXP2_SCALE, formula
from generators.site_graph import Op, Ref, Unsupported

SQRT1_2 = 0.7071067811865476

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
// The GPU converts with PTX; a host build (the CPU emulator of the tests) with the same results
// bit for bit: rounding to nearest even, and NaN as the GPU's canonical NaN.
__device__ __forceinline__ float half_to_float(unsigned short bits) {
#ifdef __CUDA_ARCH__
    float value;
    asm("cvt.f32.f16 %0, %1;" : "=f"(value) : "h"(bits));
    return value;
#else
    const unsigned int sign = (unsigned int)(bits & 0x8000u) << 16;
    const unsigned int exponent = (bits >> 10) & 0x1fu, mantissa = bits & 0x3ffu;
    if (exponent == 0x1fu) {
        return mantissa ? __uint_as_float(0x7fffffffu) : __uint_as_float(sign | 0x7f800000u);
    }
    if (exponent == 0) {  // zero or subnormal: mantissa * 2^-24, exact in float
        const float magnitude = (float)mantissa * 5.9604644775390625e-8f;
        return sign ? -magnitude : magnitude;
    }
    return __uint_as_float(sign | ((exponent + 112u) << 23) | (mantissa << 13));
#endif
}

__device__ __forceinline__ unsigned short float_to_half(float value) {
#ifdef __CUDA_ARCH__
    unsigned short bits;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(bits) : "f"(value));
    return bits;
#else
    const unsigned int x = __float_as_uint(value), magnitude = x & 0x7fffffffu;
    const unsigned short sign = (unsigned short)((x >> 16) & 0x8000u);
    if (magnitude > 0x7f800000u) { return 0x7fffu; }
    if (magnitude >= 0x477ff000u) { return sign | 0x7c00u; }  // 65520 and up round to inf
    if (magnitude >= 0x38800000u) {  // a normal half: drop 13 bits, ties to even
        const unsigned int rounded = magnitude + 0xfffu + ((magnitude >> 13) & 1u);
        return sign | (unsigned short)((rounded - 0x38000000u) >> 13);
    }
    const int shift = 126 - (int)(magnitude >> 23);  // a subnormal half: units of 2^-24
    if (shift > 24) { return sign; }
    const unsigned int mantissa = (magnitude & 0x7fffffu) | 0x800000u;
    const unsigned int half = 1u << (shift - 1), rest = mantissa & ((half << 1) - 1u);
    unsigned int units = mantissa >> shift;
    units += rest > half || (rest == half && (units & 1u));
    return sign | (unsigned short)units;
#endif
}

__device__ __forceinline__ float bf16_to_float(unsigned short bits) {
    return __uint_as_float(((unsigned int)bits) << 16);
}

__device__ __forceinline__ unsigned short float_to_bf16(float value) {
#ifdef __CUDA_ARCH__
    unsigned short bits;
    asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(bits) : "f"(value));
    return bits;
#else
    const unsigned int x = __float_as_uint(value);
    if ((x & 0x7fffffffu) > 0x7f800000u) { return 0x7fffu; }
    return (unsigned short)((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
#endif
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


class CudaEmitter:
    """How a formula of `generators.op_table` is written in CUDA C++ (every value a float)."""

    def const(self, value: float) -> str:
        if math.isnan(value):
            return "__int_as_float(0x7fffffff)"
        if math.isinf(value):
            return "__int_as_float(0x7f800000)" if value > 0 else "__int_as_float(0xff800000)"
        return f"{float(value)!r}f"

    def call(self, function: str, *args: str) -> str:
        return _FUNCTIONS[function](*args)

    def select(self, condition: str, yes: str, no: str) -> str:
        return f"(({condition}) ? ({yes}) : ({no}))"

    def truth(self, condition: str) -> str:
        return self.select(condition, "1.0f", "0.0f")

    def nonzero(self, value: str) -> str:
        return f"{value} != 0.0f"

    def round_to(self, dtype: torch.dtype, value: str) -> str:
        """`value` rounded to `dtype` and back to float, as a PyTorch cast in a chain."""
        if dtype == torch.float16:
            return f"half_to_float(float_to_half({value}))"
        if dtype == torch.bfloat16:
            return f"bf16_to_float(float_to_bf16({value}))"
        if dtype == torch.float32:
            return value
        raise Unsupported(f"a cast to {dtype} inside the chain")


# The bf16 GELU is the tanh form, exp2 and one division (generators.triton.expressions says
# why); the exact one goes through erff.
_GELU_BF16 = f"(-{GELU_EXP2_SCALE!r}f - {GELU_EXP2_CUBIC!r}f * {{0}} * {{0}})"
_FUNCTIONS: dict[str, Callable[..., str]] = {
    **{name: (lambda x, name=name: f"{name}f({x})")
       for name in ("exp", "exp2", "expm1", "log", "log2", "log1p", "sqrt", "rsqrt", "sin",
                    "cos", "erf", "tanh", "floor", "ceil", "trunc")},
    "abs": lambda x: f"fabsf({x})",
    "sigmoid": lambda x: f"sigmoid({x})",
    "maximum": lambda x, y: f"nan_max({x}, {y})",
    "minimum": lambda x, y: f"nan_min({x}, {y})",
    "pow": lambda base, exponent: f"powf({base}, {exponent})",
    "gelu_exact": lambda x: f"(0.5f * {x} * (1.0f + erff({x} * {SQRT1_2}f)))",
    "gelu_bf16": lambda x: f"({x} / (1.0f + exp2f({x} * {_GELU_BF16.format(x)})))",
}
CUDA = CudaEmitter()


def cuda_elementwise(op: Op, value: dict[Ref, str]) -> str:
    """The CUDA float expression of `op`; `value` names each Ref already in registers."""
    return formula(op, value, CUDA)
