"""Walking a planned kernel's values for a backend: the bookkeeping both languages share.

A backend (`generators.triton.values`, `generators.cuda.values`) says how a value is declared,
loaded, cast, scanned and written as a constant; this walks the IR from coordinates to those
statements, each value computed once per block, views seen through, gathers bound to the index
they read, and elementwise ops written by the op table's formulas (`generators.op_table`).
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Mapping

import torch

from core.runtime.ops import OpKind
from generators.compiler.index import Expr, Ranges, divisions, floordiv, mod, render, substitute
from generators.compiler.ir import (
    Cast,
    Constant,
    Coordinate,
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
from generators.op_table import Emitter, formula
from generators.site_graph import Op, Ref, TensorInfo, Unsupported

Coords = tuple[Expr, ...]


def is_float(dtype: torch.dtype) -> bool:
    return dtype.is_floating_point


_NAME = re.compile(r"\b[A-Za-z_]\w*\b")


def unread_dropped(lines: list[str], declaration: re.Pattern[str], comment: str) -> list[str]:
    """`lines` less the declarations (lines matching `declaration`, the name its first group)
    whose name nothing else reads, dropped until none is left: a coordinate no load or store of
    the kernel takes, say. `comment` starts the language's comments."""
    while True:
        uses = Counter(name for line in lines for name in _NAME.findall(line.split(comment)[0]))
        kept = [line for line in lines
                if not ((found := declaration.match(line)) and uses[found.group(1)] == 1)]
        if len(kept) == len(lines):
            return lines
        lines = kept


class ValueEmitter:
    """Lines of a kernel body, with the values a block already computed and the counters and
    masks in scope. Subclasses write each statement in their language."""

    language: Emitter  # the op table's emitter for formulas
    divide: str  # floor division of non-negative integers

    def __init__(self, kernel: Kernel) -> None:
        self.kernel = kernel
        self.lines: list[str] = []
        self.depth = 1
        self.memo: dict[tuple[int, Coords], str] = {}
        self.bound: dict[str, str] = {}  # counter -> the variable holding it
        # A counter's variable -> its walk's flat counter, and the counter as an expression of it.
        self.unravelled: dict[str, tuple[str, Expr]] = {}
        self.masks: dict[str, str] = {}  # "row", "column", "both": masks in scope
        self.reduced: dict[tuple[int, Coords], str] = {}  # reductions' per-row results
        self.carries: list[str] = []  # set before a column loop: the scans' running totals
        self.after: list[str] = []  # at the end of a column loop's body: the totals moved on
        self.count = 0
        self.sizes = dict(kernel.sizes)
        self.row_symbols = {kernel.symbols[d] for d in kernel.rows}
        tensors = [v.numel for v in kernel.graph.inputs]
        tensors += [o.numel for o in kernel.graph.outputs]
        self.wide = max(tensors + [kernel.row_count * max(kernel.column_count, 1)]) >= 2**31

    # What a backend writes its own way.
    def statement(self, target: str, text: str, kind: str) -> str:
        """Declare `target` = `text`; `kind` is "float", "int" (an integer tensor's value) or
        "index" (a counter or offset)."""
        raise NotImplementedError

    def load(self, value: Input, coords: Coords) -> str:
        raise NotImplementedError

    def constant(self, value: Constant) -> str:
        raise NotImplementedError

    def cast(self, value: Cast, source: str) -> str:
        raise NotImplementedError

    def scan(self, value: Scan, coords: Coords) -> str:
        raise NotImplementedError

    # Shared.
    def name(self, prefix: str = "v") -> str:
        self.count += 1
        return f"{prefix}{self.count}"

    def line(self, text: str) -> None:
        self.lines.append("    " * self.depth + text)

    def let(self, text: str, prefix: str = "v", kind: str = "float") -> str:
        target = self.name(prefix)
        self.line(self.statement(target, text, kind))
        return target

    def render(self, expr: Expr, bound: Mapping[str, str] | None = None) -> str:
        """`expr` over the counters `bound` (those in scope unless given). Where written on the
        flat counters its coordinates were unravelled from it takes fewer divisions, it is
        written on those: the divisions of a run of dimensions that lie one after the other in
        memory cancel (`(c // 512) % 512 * 512 + c % 512` is `c` for `c` under 512², and `c %
        3136` for larger `c`), and the kernel computes no coordinate it does not need."""
        bound = self.bound if bound is None else bound
        unravelled = [(s, self.unravelled[bound[s]]) for s in expr.symbols()
                      if bound.get(s) in self.unravelled]
        if unravelled:
            linear = substitute(expr, {s: coordinate for s, (_, coordinate) in unravelled},
                                Ranges(self.sizes))
            # Every walk the expression moves along stays in it (a tile's offsets keep the
            # tile's shape, even along dimensions of size 1).
            walks = {flat for _, (flat, _) in unravelled}
            through_coordinates = divisions(expr) + sum(
                divisions(coordinate) for _, (_, coordinate) in unravelled)
            fewer = divisions(linear) == 0 or divisions(linear) < through_coordinates
            if fewer and walks <= linear.symbols():
                return render(linear, bound, self.divide)
        return render(expr, bound, self.divide)

    def counters(self, vector: str, symbols: list[str]) -> None:
        """Bind `symbols` (row-major over their sizes) to coordinates of the flat `vector`."""
        sizes = [self.sizes[s] for s in symbols]
        inner = math.prod(sizes)
        flat = self.name("flat")  # a symbol for `vector`, over the product of the sizes
        self.sizes[flat], self.bound[flat] = inner, vector
        ranges = Ranges(self.sizes)
        for k, symbol in enumerate(symbols):
            inner //= sizes[k]
            text = vector if inner == 1 else f"{vector} {self.divide} {inner}"
            if k > 0:
                text = f"({text}) % {sizes[k]}"
            self.bound[symbol] = self.let(text, "c", "index")
            self.unravelled[self.bound[symbol]] = (flat, mod(floordiv(Expr.of(flat), inner,
                                                                      ranges), sizes[k], ranges))

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
            return self.constant(value)
        if isinstance(value, Coordinate):
            return self.let(self.render(value.index(list(coords))), "i", "index")
        if isinstance(value, Elementwise):
            return self.elementwise(value, coords)
        if isinstance(value, Cast):
            return self.cast(value, self.value(value.source, coords))
        if isinstance(value, View):
            ranges = Ranges(self.sizes)
            return self.value(value.source, tuple(value.source_coords(list(coords), ranges)))
        if isinstance(value, Gather):
            return self.gather(value, coords)
        if isinstance(value, Scan):
            return self.scan(value, coords)
        if isinstance(value, Reduce):
            raise Unsupported("a reduction met before its loop ran (a planning error)")
        raise Unsupported(f"no kernel computes a {type(value).__name__}")

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
        kind = "float" if is_float(value.dtype) or value.dtype == torch.bool else "int"
        return self.let(formula(op, refs, self.language), kind=kind)

    def gather(self, value: Gather, coords: Coords) -> str:
        index = self.value(value.index, coords)
        picked = self.name("g")
        self.sizes[picked] = value.source.shape[value.dim]
        self.bound[picked] = index
        source = list(coords)
        source[value.dim] = Expr.of(picked)
        return self.value(value.source, tuple(source))
