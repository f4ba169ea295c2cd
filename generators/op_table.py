"""Every elementwise op's formula, once, for both kernel languages.

A formula is written against `Emitter`, the few things a language must say its own way
(literals, math functions, a select, a comparison as a value, a rounding cast); the Triton and
CUDA backends each supply one. All arithmetic is fp32 whatever the tensors' dtype, and NaN
behaves as in PyTorch (`relu(nan)` and `maximum(nan, 1)` are nan).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Protocol

import torch

from generators.codegen import BINARY_OPERATORS, COMPARISONS, arg, arg_at
from generators.site_graph import Op, Ref, Unsupported

SQRT_2_OVER_PI = 0.7978845608028654
# The tanh-form GELU's exponent is -(x * GELU_EXP2_SCALE + x^3 * GELU_EXP2_CUBIC):
# 2 sqrt(2/pi) log2(e) (x + 0.044715 x^3).
GELU_EXP2_SCALE = 2.0 * SQRT_2_OVER_PI * math.log2(math.e)
GELU_EXP2_CUBIC = GELU_EXP2_SCALE * 0.044715

# The math functions a formula may call; each emitter renders every one of them.
FUNCTIONS = frozenset({
    "abs", "exp", "exp2", "expm1", "log", "log2", "log1p", "sqrt", "rsqrt", "sin", "cos",
    "erf", "tanh", "sigmoid", "floor", "ceil", "trunc",
    "maximum", "minimum",  # NaN-propagating, as torch.maximum and torch.minimum
    "pow",  # (base, exponent) with a constant exponent
    "gelu_exact",  # x * Phi(x)
    "gelu_bf16",  # the tanh form, for a result PyTorch rounds to bfloat16
})
# Ops that pass their first argument through unchanged inside a kernel.
IDENTITIES = frozenset({"dropout", "identity", "detach", "view", "reshape", "flatten",
                        "unsqueeze", "squeeze", "unflatten", "contiguous", "double"})
CASTS = frozenset({"float", "half", "bfloat16", "to", "type_as"})


class Emitter(Protocol):
    """What a kernel language says its own way; every value is an fp32 expression."""

    def const(self, value: float) -> str:
        """A float literal (inf and nan included)."""

    def call(self, function: str, *args: str) -> str:
        """`function` (one of FUNCTIONS) applied to expressions."""

    def select(self, condition: str, yes: str, no: str) -> str:
        """`yes` where `condition` (a comparison) holds, else `no`."""

    def truth(self, condition: str) -> str:
        """A comparison as a value: true 1, false 0."""

    def nonzero(self, value: str) -> str:
        """The comparison `value != 0`, for masks and conditions held as values."""

    def round_to(self, dtype: torch.dtype, value: str) -> str:
        """`value` rounded to `dtype` and back to fp32, as a cast inside a chain."""


def constant(value: object, emit: Emitter) -> str:
    if isinstance(value, bool):
        return emit.const(1.0 if value else 0.0)
    if isinstance(value, int | float):
        return emit.const(float(value))
    raise Unsupported(f"constant {value!r} in an elementwise op")


def _pow(base: str, exponent: object, emit: Emitter) -> str:
    if isinstance(exponent, int | float) and float(exponent).is_integer() and abs(exponent) <= 4:
        k = int(exponent)
        if k == 0:
            # One everywhere, NaN included, as torch.pow(x, 0); written as a select on the
            # base so that the result keeps the base's shape in a Triton block.
            return emit.select(f"{base} == {base}", emit.const(1.0), emit.const(1.0))
        product = " * ".join([base] * abs(k))
        return f"({product})" if k > 0 else f"({emit.const(1.0)} / ({product}))"
    if exponent == 0.5:
        return emit.call("sqrt", base)
    return emit.call("pow", base, constant(exponent, emit))


def _hard_sigmoid(x: str, emit: Emitter) -> str:
    """min(max(x / 6 + 1/2, 0), 1) through selects, so that NaN stays NaN as in PyTorch."""
    t = f"({x} / {emit.const(6.0)} + {emit.const(0.5)})"
    zero, one = emit.const(0.0), emit.const(1.0)
    return emit.select(f"{t} < {zero}", zero, emit.select(f"{t} > {one}", one, t))


def _log_sigmoid(x: str, emit: Emitter) -> str:
    """min(x, 0) - log1p(exp(-|x|)): exp never overflows, however negative x is."""
    zero = emit.const(0.0)
    low = emit.select(f"{x} < {zero}", x, zero)
    tail = emit.call("log1p", emit.call("exp", f"(-{emit.call('abs', x)})"))
    return f"({low} - {tail})"


# Ops of one tensor and no parameters, as formulas of their argument.
UNARY: dict[str, Callable[[str, Emitter], str]] = {
    **{name: (lambda x, e, name=name: e.call(name, x))
       for name in ("abs", "exp", "log", "sqrt", "rsqrt", "sigmoid", "tanh", "sin", "cos", "erf",
                    "exp2", "log2", "log1p", "expm1", "floor", "ceil")},
    "neg": lambda x, e: f"(-{x})",
    "negative": lambda x, e: f"(-{x})",
    "reciprocal": lambda x, e: f"({e.const(1.0)} / {x})",
    "square": lambda x, e: f"({x} * {x})",
    "silu": lambda x, e: f"({x} * {e.call('sigmoid', x)})",
    "relu": lambda x, e: e.select(f"{x} < {e.const(0.0)}", e.const(0.0), x),
    "relu6": lambda x, e: e.select(f"{x} < {e.const(0.0)}", e.const(0.0),
                                   e.select(f"{x} > {e.const(6.0)}", e.const(6.0), x)),
    "hardsigmoid": _hard_sigmoid,
    "hardswish": lambda x, e: f"({x} * {_hard_sigmoid(x, e)})",
    "mish": lambda x, e: f"({x} * {e.call('tanh', e.call('log1p', e.call('exp', x)))})",
    "logsigmoid": _log_sigmoid,
    "softsign": lambda x, e: f"({x} / ({e.const(1.0)} + {e.call('abs', x)}))",
    "logical_not": lambda x, e: e.truth(f"{x} == {e.const(0.0)}"),
    "bitwise_not": lambda x, e: e.truth(f"{x} == {e.const(0.0)}"),
    "isnan": lambda x, e: e.truth(f"{x} != {x}"),
    "isinf": lambda x, e: e.truth(f"{e.call('abs', x)} == {e.const(math.inf)}"),
    "sign": lambda x, e: e.select(f"{x} > {e.const(0.0)}", e.const(1.0), e.select(
        f"{x} < {e.const(0.0)}", e.const(-1.0), e.const(0.0))),  # sign(nan) is 0, as in torch
    "trunc": lambda x, e: e.call("trunc", x),
}
# Ops of two values whose result is a truth: both sides taken as truths.
LOGICAL = {"logical_and": "&", "logical_or": "|", "logical_xor": "^", "bitwise_and": "&",
           "bitwise_or": "|", "bitwise_xor": "^"}
# Ops with more arguments or parameters, each a case of `formula`.
SPECIAL = frozenset({"rsub", "gelu", "pow", "clamp", "clip", "hardtanh", "clamp_min",
                     "clamp_max", "maximum", "minimum", "leaky_relu", "elu", "softplus",
                     "where", "masked_fill", "batch_norm"})
ELEMENTWISE_OPS = frozenset(BINARY_OPERATORS) | frozenset(COMPARISONS) | IDENTITIES | CASTS \
    | frozenset(UNARY) | frozenset(LOGICAL) | SPECIAL


def formula(op: Op, value: dict[Ref, str], emit: Emitter) -> str:
    """The fp32 expression of elementwise `op`; `value` names each Ref already computed."""

    def v(x: object) -> str:
        return value[x] if isinstance(x, Ref) else constant(x, emit)

    def kw(name: str, position: int, default: object) -> object:
        return arg(op, name, position, default)

    name = op.name
    x = v(arg_at(op, 0)) if op.args else ""
    if name in ("add", "sub") and kw("alpha", 2, 1) != 1:
        alpha = constant(kw("alpha", 2, 1), emit)
        return f"({x} {BINARY_OPERATORS[name]} {alpha} * {v(arg_at(op, 1))})"
    if name in ("div", "divide") and op.kwarg("rounding_mode") is not None:
        quotient = f"({x} / {v(arg_at(op, 1))})"
        return emit.call("floor" if op.kwarg("rounding_mode") == "floor" else "trunc", quotient)
    if name in BINARY_OPERATORS:
        return f"({x} {BINARY_OPERATORS[name]} {v(arg_at(op, 1))})"
    if name == "rsub":
        return f"({v(arg_at(op, 1))} - {x})"
    if name in COMPARISONS:
        return emit.truth(f"{x} {COMPARISONS[name]} {v(arg_at(op, 1))}")
    if name in LOGICAL:
        return emit.truth(f"({emit.nonzero(x)}) {LOGICAL[name]} "
                          f"({emit.nonzero(v(arg_at(op, 1)))})")
    if name in IDENTITIES:
        return x
    if name in CASTS:
        # Round through the target dtype, as PyTorch does, then keep computing in fp32.
        return emit.round_to(op.out.dtype, x) if op.out.dtype.is_floating_point else x
    if name in UNARY:
        return UNARY[name](x, emit)
    if name == "gelu":
        if op.kwarg("approximate", "none") == "tanh":
            cubic = f"{emit.const(0.044715)} * {x} * {x} * {x}"
            inner = f"{emit.const(SQRT_2_OVER_PI)} * ({x} + {cubic})"
            return f"({emit.const(0.5)} * {x} * ({emit.const(1.0)} + {emit.call('tanh', inner)}))"
        return emit.call("gelu_bf16" if op.out.dtype == torch.bfloat16 else "gelu_exact", x)
    if name == "pow":
        if isinstance(arg_at(op, 0), Ref) and not isinstance(arg_at(op, 1), Ref):
            return _pow(x, arg_at(op, 1), emit)
        raise Unsupported("pow with a tensor exponent")
    if name in ("clamp", "clip", "hardtanh"):
        low, high = kw("min", 1, None), kw("max", 2, None)
        if name == "hardtanh":
            low, high = kw("min_val", 1, -1.0), kw("max_val", 2, 1.0)
        result = x
        if low is not None:
            result = emit.select(f"{result} < {v(low)}", v(low), result)
        if high is not None:
            result = emit.select(f"{result} > {v(high)}", v(high), result)
        return result
    if name in ("clamp_min", "clamp_max"):
        bound = v(arg_at(op, 1))
        return emit.select(f"{x} {'<' if name == 'clamp_min' else '>'} {bound}", bound, x)
    if name in ("maximum", "minimum"):
        return emit.call(name, x, v(arg_at(op, 1)))
    if name == "leaky_relu":
        slope = constant(kw("negative_slope", 1, 0.01), emit)
        return emit.select(f"{x} >= {emit.const(0.0)}", x, f"{x} * {slope}")
    if name == "elu":
        # aten.elu(x, alpha, scale, input_scale): SELU is ELU with a scale (and CELU with an
        # input scale); the negative side is scale * alpha * expm1(x * input_scale).
        alpha, scale, input_scale = (kw(key, position, 1.0) for key, position
                                     in (("alpha", 1), ("scale", 2), ("input_scale", 3)))
        inner = x if input_scale == 1 else f"{x} * {constant(input_scale, emit)}"
        negative = f"{constant(alpha, emit)} * {emit.call('expm1', inner)}"
        result = emit.select(f"{x} > {emit.const(0.0)}", x, negative)
        return result if scale == 1 else f"({constant(scale, emit)} * {result})"
    if name == "softplus":
        beta, threshold = constant(kw("beta", 1, 1.0), emit), constant(kw("threshold", 2, 20.0),
                                                                        emit)
        soft = f"{emit.call('log1p', emit.call('exp', f'{x} * {beta}'))} / {beta}"
        return emit.select(f"{x} * {beta} > {threshold}", x, soft)
    if name == "where":
        return emit.select(emit.nonzero(v(arg_at(op, 0))), v(arg_at(op, 1)), v(arg_at(op, 2)))
    if name == "masked_fill":
        return emit.select(emit.nonzero(v(arg_at(op, 1))), v(arg_at(op, 2)), x)
    if name == "batch_norm":
        mean, var, weight, bias = (arg_at(op, i) for i in (1, 2, 3, 4))
        eps = constant(kw("eps", 7, 1e-5), emit)
        result = f"(({x} - {v(mean)}) * {emit.call('rsqrt', f'{v(var)} + {eps}')})"
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
