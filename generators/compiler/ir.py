"""The compiler's IR: a site as a graph of values, each a function of its own coordinates.

A value has a shape and a dtype. An input is read at its coordinates; an elementwise value
computes an op table formula from its arguments (broadcast as PyTorch broadcasts); a view finds
its source's coordinates from its own (`source_coords`); a reduction combines its source over
some dimensions, a scan along one, a gather reads its source at coordinates another value gives.
Nothing here says how a kernel loops: that is the plan's and the schedule's.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import torch

from generators.compiler.index import Expr, Ranges, mod, reshape

# Reductions, and the value each starts from.
REDUCTIONS = ("sum", "prod", "amax", "amin", "mean", "var", "argmax", "argmin")
SCANS = ("cumsum", "cumprod", "cummax", "cummin", "logcumsumexp")


@dataclass(eq=False)
class Value:
    shape: tuple[int, ...]
    dtype: torch.dtype

    @property
    def numel(self) -> int:
        count = 1
        for size in self.shape:
            count *= size
        return count

    def operands(self) -> tuple[Value, ...]:
        return ()


@dataclass(eq=False)
class Input(Value):
    index: int = 0
    stride: tuple[int, ...] = ()  # in elements, as the site's input is laid out
    # How the forward computes it through the vendor library before the kernels (a
    # convolution, `generators.compiler.library`); empty for the site's own inputs.
    call: str = ""

    def offset(self, coords: Sequence[Expr]) -> Expr:
        """Where the element at `coords` lies in the input's memory, in elements."""
        offset = Expr()
        for coord, stride in zip(coords, self.stride, strict=True):
            offset = offset + coord.scale(stride)
        return offset


@dataclass(eq=False)
class Constant(Value):
    value: float | int | bool = 0


@dataclass(eq=False)
class Elementwise(Value):
    """An op of the op table (`generators.op_table`) on values and constants."""

    op: str = ""
    args: tuple[object, ...] = ()  # Values and constants, as the op table reads them
    kwargs: tuple[tuple[str, object], ...] = ()

    def operands(self) -> tuple[Value, ...]:
        found = [a for a in self.args if isinstance(a, Value)]
        found += [v for _, v in self.kwargs if isinstance(v, Value)]
        return tuple(found)


@dataclass(eq=False)
class Cast(Value):
    """The source rounded to this value's dtype (a PyTorch `.to` in the middle of a chain)."""

    source: Value | None = None

    def operands(self) -> tuple[Value, ...]:
        return (self.source,)


@dataclass(eq=False)
class View(Value):
    """The source's elements at other coordinates: "reshape", "permute" (`dims`: the source
    dimension of each of ours), "expand" (size-1 source dimensions repeated), "window" (the
    sliding windows of a pooling or a depthwise convolution, `window`)."""

    source: Value | None = None
    kind: str = "reshape"
    dims: tuple[int, ...] = ()
    window: Window | None = None

    def operands(self) -> tuple[Value, ...]:
        return (self.source,)

    def source_coords(self, coords: list[Expr], ranges: Ranges) -> list[Expr]:
        source = self.source
        assert source is not None
        if self.kind == "permute":
            out = [Expr()] * len(self.dims)
            for ours, theirs in enumerate(self.dims):
                out[theirs] = coords[ours]
            return out
        if self.kind == "expand":
            return broadcast_coords(coords, self.shape, source.shape)
        if self.kind == "window":
            assert self.window is not None
            return self.window.source_coords(coords, source.shape, ranges)
        return reshape(coords, self.shape, source.shape, ranges)


@dataclass(frozen=True)
class Window:
    """Sliding windows over a source's last `len(stride)` dimensions. The view's shape is the
    source's leading dimensions, one position a windowed dimension, then one offset a windowed
    dimension; (.., p, .., k, ..) reads the source at p * stride + k * dilation - padding.
    Where that falls in the padding, the view reads a valid element instead (wrapped around),
    which the lowering replaces by the padding's value (`Coordinate` tells where)."""

    stride: tuple[int, ...]
    padding: tuple[int, ...]
    dilation: tuple[int, ...]

    def positions(self, coords: list[Expr], lead: int) -> list[Expr]:
        """The windowed dimensions' source positions, padding not yet taken away."""
        w = len(self.stride)
        return [coords[lead + i].scale(self.stride[i]) + coords[lead + w + i].scale(
            self.dilation[i]) for i in range(w)]

    def source_coords(self, coords: list[Expr], source: tuple[int, ...], ranges: Ranges
                      ) -> list[Expr]:
        lead = len(source) - len(self.stride)
        out = list(coords[:lead])
        for i, position in enumerate(self.positions(coords, lead)):
            size, pad = source[lead + i], self.padding[i]
            out.append(position if pad == 0 else mod(position + (size - pad), size, ranges))
        return out


@dataclass(eq=False)
class Missing(Value):
    """A result the IR does not compute (a max pooling's indices): planning it stops the site."""

    why: str = ""


@dataclass(eq=False)
class Coordinate(Value):
    """An index of the elements' own coordinates: the coordinate along each of `dims` (a pair
    for a window's position and offset) times its entry of `scales`, summed, plus `offset`."""

    dims: tuple[int, ...] = ()
    scales: tuple[int, ...] = ()
    offset: int = 0

    def index(self, coords: list[Expr]) -> Expr:
        total = Expr.of(self.offset)
        for dim, scale in zip(self.dims, self.scales, strict=True):
            total = total + coords[dim].scale(scale)
        return total


@dataclass(eq=False)
class Reduce(Value):
    """`kind` of the source over `dims`, kept as size-1 dimensions when `keepdim`. var takes
    `correction`; argmax and argmin reduce one dimension and give int64 indices."""

    source: Value | None = None
    kind: str = "sum"
    dims: tuple[int, ...] = ()
    keepdim: bool = False
    correction: float = 0.0

    def operands(self) -> tuple[Value, ...]:
        return (self.source,)

    def source_coords(self, coords: list[Expr], loop: list[Expr]) -> list[Expr]:
        """The source's coordinates for our `coords` and the reduced dimensions' `loop`
        counters, in the order of `dims`."""
        assert self.source is not None
        out: list[Expr] = []
        ours = iter(coords)
        reduced = dict(zip(self.dims, loop, strict=True))
        for d in range(len(self.source.shape)):
            if d in reduced:
                out.append(reduced[d])
                if self.keepdim:
                    next(ours)
            else:
                out.append(next(ours))
        return out

    @property
    def reduced_shape(self) -> tuple[int, ...]:
        assert self.source is not None
        return tuple(self.source.shape[d] for d in self.dims)


@dataclass(eq=False)
class Scan(Value):
    """`kind` of the source along `dim`, inclusive: element i combines elements 0..i."""

    source: Value | None = None
    kind: str = "cumsum"
    dim: int = 0

    def operands(self) -> tuple[Value, ...]:
        return (self.source,)


@dataclass(eq=False)
class Gather(Value):
    """The source at our coordinates, but along `dim` at the position `index` holds there."""

    source: Value | None = None
    dim: int = 0
    index: Value | None = None

    def operands(self) -> tuple[Value, ...]:
        return (self.source, self.index)


@dataclass
class Graph:
    """A site as values: its inputs in forward's order, its outputs in return order."""

    inputs: list[Input]
    outputs: list[Value]
    returns_tuple: bool = False
    names: dict[int, str] = field(default_factory=dict)  # id(value) -> the aten op it came from

    def values(self) -> Iterator[Value]:
        """Every value the outputs depend on, each once, operands before their users."""
        seen: set[int] = set()
        order: list[Value] = []

        def visit(value: Value) -> None:
            if id(value) in seen:
                return
            seen.add(id(value))
            for operand in value.operands():
                visit(operand)
            order.append(value)

        for output in self.outputs:
            visit(output)
        return iter(order)


def broadcast_coords(coords: list[Expr], shape: tuple[int, ...], operand: tuple[int, ...]
                     ) -> list[Expr]:
    """Coordinates in an operand of `operand` shape, broadcast to `shape` as PyTorch does:
    dimensions aligned from the right, size-1 dimensions read at 0."""
    lead = len(shape) - len(operand)
    return [Expr() if size == 1 else coords[lead + d] for d, size in enumerate(operand)]
