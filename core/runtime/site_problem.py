"""Writing a region as a site problem: a stateless KernelBench-format Python file.

The file's `Model.forward` is the region's ops, every tensor it reads (weights too) an
argument; `get_inputs()` draws tensors of the captured shapes, strides, dtypes and value
statistics; `get_init_inputs()` is `[]`. Inputs and locals get canonical names (`in0`, `v0`),
so identical regions anywhere in the model produce the same source, and the hash of that
source is the site's identity.
"""

from __future__ import annotations

import hashlib
import math
import operator
from dataclasses import dataclass

import torch
import torch.fx as fx

from .ops import op_info, qualified_function_name
from .regions import Region

_INFIX = {
    operator.add: "+",
    operator.sub: "-",
    operator.mul: "*",
    operator.truediv: "/",
    operator.floordiv: "//",
    operator.mod: "%",
    operator.pow: "**",
    operator.matmul: "@",
    operator.eq: "==",
    operator.ne: "!=",
    operator.lt: "<",
    operator.le: "<=",
    operator.gt: ">",
    operator.ge: ">=",
    operator.and_: "&",
    operator.or_: "|",
    operator.xor: "^",
}
_PREFIX = {operator.neg: "-", operator.invert: "~"}
_DTYPE_SHORT = {
    torch.float32: "f32",
    torch.float16: "f16",
    torch.bfloat16: "bf16",
    torch.float64: "f64",
    torch.int64: "i64",
    torch.int32: "i32",
    torch.bool: "bool",
    torch.uint8: "u8",
    torch.int8: "i8",
}


class CodegenError(ValueError):
    """A region holds something a problem file cannot spell (an unknown callable or constant)."""


@dataclass(frozen=True)
class InputSpec:
    """How `get_inputs()` redraws one captured tensor."""

    shape: tuple[int, ...]
    stride: tuple[int, ...]
    dtype: torch.dtype
    mean: float
    std: float
    low: float
    high: float

    @staticmethod
    def of(value: torch.Tensor) -> InputSpec:
        flat = value.detach().reshape(-1)
        mean, std, low, high = moments(flat) if flat.numel() else (0.0, 0.0, 0.0, 0.0)
        return InputSpec(tuple(value.shape), tuple(value.stride()), value.dtype,
                         _finite(mean), _finite(std), _finite(low), _finite(high))

    def short(self) -> str:
        dtype = _DTYPE_SHORT.get(self.dtype, str(self.dtype).removeprefix("torch."))
        return f"{dtype}[{','.join(map(str, self.shape))}]"


# Values per chunk when an input's moments are taken: a chunk's fp64 copy is 128 MiB, so that a
# multi-GB input costs no full-size temporary on its device.
MOMENT_CHUNK = 1 << 24


def moments(flat: torch.Tensor) -> tuple[float, float, float, float]:
    """Mean, standard deviation, min and max of a non-empty 1-D tensor, in fp64, chunk by chunk
    (the chunks' moments combined as Chan et al. combine partial variances)."""
    count, mean, square_sum = 0, 0.0, 0.0
    lows, highs = [], []
    for chunk in flat.split(MOMENT_CHUNK):
        data = chunk.double()
        n = data.numel()
        chunk_mean = data.mean().item()
        chunk_squares = (data - chunk_mean).square().sum().item()
        delta, total = chunk_mean - mean, count + n
        mean += delta * n / total
        square_sum += chunk_squares + delta * delta * count * n / total
        count = total
        lows.append(data.min().item())
        highs.append(data.max().item())
    std = math.sqrt(square_sum / (count - 1)) if count > 1 else 0.0
    # min() and max() of a list skip NaN where a tensor's do not: keep the tensor's answer.
    low, high = torch.tensor(lows).min().item(), torch.tensor(highs).max().item()
    return mean, std, low, high


def _finite(x: float) -> float:
    return x if math.isfinite(x) else (0.0 if math.isnan(x) else math.copysign(3.0e38, x))


@dataclass(frozen=True)
class SiteProblem:
    key: str  # family and source hash, e.g. "reduction-1a2b3c4d": stable across runs
    family: str
    ops: tuple[str, ...]
    signature: str  # readable: ops and input shapes
    source: str
    inputs: tuple[InputSpec, ...]


def _constant(value: object) -> str:
    if value is None or isinstance(value, bool | int | str):
        return repr(value)
    if isinstance(value, float):
        return repr(value) if math.isfinite(value) else f"float({str(value)!r})"
    if isinstance(value, torch.dtype | torch.memory_format | torch.layout):
        return str(value)
    if isinstance(value, torch.device):
        return f"torch.device({str(value)!r})"
    if isinstance(value, slice):
        return f"slice({_constant(value.start)}, {_constant(value.stop)}, {_constant(value.step)})"
    if value is Ellipsis:
        return "..."
    raise CodegenError(f"cannot write the constant {value!r} ({type(value).__name__})")


class _Writer:
    def __init__(self, names: dict[fx.Node, str]) -> None:
        self.names = names

    def arg(self, value: object) -> str:
        if isinstance(value, fx.Node):
            return self.names[value]
        if isinstance(value, tuple | list | torch.Size):
            items = [self.arg(v) for v in value]
            if isinstance(value, list):
                return f"[{', '.join(items)}]"
            return f"({items[0]},)" if len(items) == 1 else f"({', '.join(items)})"
        return _constant(value)

    def call_args(self, args: tuple, kwargs: dict) -> str:
        parts = [self.arg(a) for a in args] + [f"{k}={self.arg(v)}" for k, v in kwargs.items()]
        return ", ".join(parts)

    def expression(self, node: fx.Node) -> str:
        if node.op == "call_method":
            receiver, *rest = node.args
            return f"{self.arg(receiver)}.{node.target}({self.call_args(tuple(rest), node.kwargs)})"
        target = node.target
        if target in _INFIX and len(node.args) == 2 and not node.kwargs:
            return f"{self.arg(node.args[0])} {_INFIX[target]} {self.arg(node.args[1])}"
        if target in _PREFIX and len(node.args) == 1:
            return f"{_PREFIX[target]}{self.arg(node.args[0])}"
        if target is operator.getitem and len(node.args) == 2 and not node.kwargs:
            return f"{self.arg(node.args[0])}[{self.arg(node.args[1])}]"
        name = qualified_function_name(target)
        if name is None:
            raise CodegenError(f"cannot write a call to {target!r} in a problem file")
        return f"{name}({self.call_args(node.args, node.kwargs)})"


_TEMPLATE = '''"""Kiln site problem ({family}): {signature}"""

import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, {params}):
{body}
        return {returns}


def get_inputs():
    return [
{inputs}
    ]


def get_init_inputs():
    return []


def _tensor(shape, stride, dtype, mean, std, low, high):
    """A tensor with the captured layout and value statistics (normal, clamped to the range)."""
    extent = 1 + sum((size - 1) * step for size, step in zip(shape, stride))
    if dtype == torch.bool:
        base = torch.rand(extent) < mean
    elif dtype.is_floating_point or dtype.is_complex:
        # Drawn in its own dtype where randn can (no copy of twice its size), else in fp32.
        work = dtype if dtype in (torch.float32, torch.float64) else torch.float32
        base = torch.randn(extent, dtype=work).mul_(std).add_(mean)
        base = base.clamp_(low, high).to(dtype)
    else:
        base = torch.randint(int(low), int(high) + 1, (extent,)).to(dtype)
    return base.as_strided(shape, stride)
'''


def _spec_line(spec: InputSpec) -> str:
    numbers = ", ".join(repr(x) for x in (spec.mean, spec.std, spec.low, spec.high))
    return f"        _tensor({spec.shape}, {spec.stride}, {spec.dtype}, {numbers}),"


def _body(region: Region) -> tuple[list[str], str]:
    """The forward's statements and return expression, with canonical names."""
    names = {node: f"in{i}" for i, node in enumerate(region.inputs)}
    writer = _Writer(names)
    body: list[str] = []
    for i, node in enumerate(region.nodes):
        names[node] = f"v{i}"
        body.append(f"        v{i} = {writer.expression(node)}")
    return body, ", ".join(names[n] for n in region.outputs)


def _layout(node: fx.Node) -> str:
    value = node.meta.get("example_value")
    if not isinstance(value, torch.Tensor):
        raise CodegenError(f"region input {node.name} is a {type(value).__name__}, not a tensor")
    return f"{tuple(value.shape)}{value.stride()}{value.dtype}"


def region_key(region: Region) -> str:
    """The site identity of a region: its computation and input layouts, not its values.

    Twelve transformer blocks with different weights are one site.
    """
    body, returns = _body(region)
    structure = "\n".join([*body, returns, *(_layout(n) for n in region.inputs)])
    return f"{region.family}-{hashlib.sha256(structure.encode()).hexdigest()[:10]}"


def write_problem(region: Region, values: dict[fx.Node, object]) -> SiteProblem:
    """The problem source for `region`; `values` holds the real value of each region input."""
    key = region_key(region)
    specs = tuple(InputSpec.of(values[node]) for node in region.inputs)
    body, returns = _body(region)
    ops = tuple(op_info(n).name for n in region.nodes)
    signature = " → ".join(ops) + " | " + " ".join(s.short() for s in specs)
    source = _TEMPLATE.format(
        family=region.family,
        signature=signature,
        params=", ".join(f"in{i}" for i in range(len(specs))),
        body="\n".join(body),
        returns=returns,
        inputs="\n".join(_spec_line(s) for s in specs),
    )
    return SiteProblem(key, region.family, ops, signature, source, specs)
