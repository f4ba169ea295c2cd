"""The compiler's IR values written as Triton tiles: loads, op table formulas, casts, views,
gathers and scans, each computed once per block of a kernel.

A program holds `BLOCK_ROWS` rows as a [rows, 1] column of counters and walks columns as a
[1, columns] row of them, so that each value is a tile that broadcasts as its coordinates say.
Every value is computed in fp32 (integers and booleans keep their type), as the op table writes
it (`generators.triton.expressions`). Strides are the site's, written into the source: a kernel
is proven, and installed behind a guard, for exactly those layouts.
"""

from __future__ import annotations

import math

import torch

from core.runtime.ops import OpKind
from generators.compiler.index import Expr, Ranges, render
from generators.compiler.ir import (
    Cast,
    Constant,
    Elementwise,
    Gather,
    Input,
    Reduce,
    Scan,
    Value,
    View,
    broadcast_coords,
)
from generators.compiler.plan import Kernel
from generators.op_table import formula
from generators.site_graph import Op, Ref, TensorInfo, Unsupported
from generators.triton.expressions import TRITON, tl_dtype

Coords = tuple[Expr, ...]
PROD_HELPER = '''@triton.jit
def _times(a, b):
    return a * b
'''


def is_float(dtype: torch.dtype) -> bool:
    return dtype.is_floating_point


class ValueWriter:
    """Lines of a kernel body, with the values a block already computed and the counters and
    masks in scope."""

    def __init__(self, kernel: Kernel) -> None:
        self.kernel = kernel
        self.lines: list[str] = []
        self.depth = 1
        self.memo: dict[tuple[int, Coords], str] = {}
        self.bound: dict[str, str] = {}  # counter -> the variable holding it
        self.masks: dict[str, str] = {}  # "row", "column", "both": masks in scope
        self.reduced: dict[tuple[int, Coords], str] = {}  # reductions' [rows, 1] results
        self.carries: list[str] = []  # set before a column loop: the scans' running totals
        self.after: list[str] = []  # at the end of a column loop's body: the totals moved on
        self.count = 0
        self.sizes = dict(kernel.sizes)
        self.row_symbols = {kernel.symbols[d] for d in kernel.rows}
        tensors = [v.numel for v in kernel.graph.inputs]
        tensors += [o.numel for o in kernel.graph.outputs]
        self.wide = max(tensors + [kernel.row_count * max(kernel.column_count, 1)]) >= 2**31

    def name(self, prefix: str = "v") -> str:
        self.count += 1
        return f"{prefix}{self.count}"

    def line(self, text: str) -> None:
        self.lines.append("    " * self.depth + text)

    def let(self, text: str, prefix: str = "v") -> str:
        target = self.name(prefix)
        self.line(f"{target} = {text}")
        return target

    def counters(self, vector: str, symbols: list[str]) -> None:
        """Bind `symbols` (row-major over their sizes) to coordinates of the flat `vector`."""
        sizes = [self.sizes[s] for s in symbols]
        inner = math.prod(sizes)
        for k, symbol in enumerate(symbols):
            inner //= sizes[k]
            text = vector if inner == 1 else f"{vector} // {inner}"
            if k > 0:
                text = f"({text}) % {sizes[k]}"
            self.bound[symbol] = self.let(text, "c")

    def mask_for(self, symbols: set[str]) -> str | None:
        rows, columns = bool(symbols & self.row_symbols), bool(symbols - self.row_symbols)
        if rows and columns:
            return self.masks.get("both")
        if columns:
            return self.masks.get("column")
        return self.masks.get("row") if rows else None

    def value(self, value: Value, coords: Coords) -> str:
        key = (id(value), coords)
        if key in self.reduced:
            return self.reduced[key]
        if key not in self.memo:
            self.memo[key] = self.compute(value, coords)
        return self.memo[key]

    def compute(self, value: Value, coords: Coords) -> str:
        if isinstance(value, Input):
            return self.load(value, coords)
        if isinstance(value, Constant):
            if is_float(value.dtype):
                return TRITON.const(float(value.value))
            return str(int(value.value))
        if isinstance(value, Elementwise):
            return self.elementwise(value, coords)
        if isinstance(value, Cast):
            source = self.value(value.source, coords)
            if is_float(value.dtype):
                if not is_float(value.source.dtype) or value.dtype.itemsize >= 4:
                    return self.let(f"({source}).to(tl.float32)")
                return self.let(TRITON.round_to(value.dtype, source))
            return self.let(f"({source}).to({tl_dtype(value.dtype)})")
        if isinstance(value, View):
            ranges = Ranges(self.sizes)
            return self.value(value.source, tuple(value.source_coords(list(coords), ranges)))
        if isinstance(value, Gather):
            return self.gather(value, coords)
        if isinstance(value, Scan):
            return self.scan(value, coords)
        if isinstance(value, Reduce):
            raise Unsupported("a reduction met before its loop ran (a planning error)")
        raise Unsupported(f"no Triton for a {type(value).__name__}")

    def load(self, value: Input, coords: Coords) -> str:
        offset = Expr()
        for coord, stride in zip(coords, value.stride, strict=True):
            offset = offset + coord.scale(stride)
        mask = self.mask_for(offset.symbols())
        where = f"in{value.index}"
        if offset.terms or offset.constant:
            where += f" + {render(offset, self.bound)}"
        masked = f", mask={mask}, other=0" if mask else ""
        loaded = f"tl.load({where}{masked})"
        if is_float(value.dtype):
            loaded += ".to(tl.float32)"
        return self.let(loaded, "x")

    def elementwise(self, value: Elementwise, coords: Coords) -> str:
        refs: dict[Ref, str] = {}

        def ref(arg: object) -> object:
            if isinstance(arg, Value):
                r = Ref(len(refs), False)
                refs[r] = self.value(arg, tuple(broadcast_coords(list(coords), value.shape,
                                                                 arg.shape)))
                return r
            return arg

        op = Op(value.op, OpKind.POINTWISE, tuple(ref(a) for a in value.args),
                tuple((k, ref(v)) for k, v in value.kwargs),
                TensorInfo(value.shape, (), value.dtype))
        return self.let(formula(op, refs, TRITON))

    def gather(self, value: Gather, coords: Coords) -> str:
        index = self.value(value.index, coords)
        picked = self.name("g")
        self.sizes[picked] = value.source.shape[value.dim]
        self.bound[picked] = index
        source = list(coords)
        source[value.dim] = Expr.of(picked)
        return self.value(value.source, tuple(source))

    def scan(self, value: Scan, coords: Coords) -> str:
        """An inclusive scan along the column loop: this block's scan plus the total of the
        blocks before it, carried across the loop."""
        neutral = "0.0" if value.kind == "cumsum" else "1.0"
        source = self.value(value.source, coords)
        kept = self.let(f"tl.where({self.masks['both']}, {source}, {neutral})")
        carry = self.name("carry")
        self.carries.append(f"{carry} = tl.full([BLOCK_ROWS, 1], {neutral}, tl.float32)")
        if value.kind == "cumsum":
            scanned = self.let(f"tl.cumsum({kept}, axis=1) + {carry}")
            self.after.append(f"{carry} = {carry} + tl.sum({kept}, axis=1)[:, None]")
        else:
            scanned = self.let(f"tl.cumprod({kept}, axis=1) * {carry}")
            self.after.append(f"{carry} = {carry} * tl.reduce({kept}, 1, _times)[:, None]")
        return scanned
