"""The compiler's IR values written as Triton tiles.

A program holds `BLOCK_ROWS` rows as a [rows, 1] column of counters and walks columns as a
[1, columns] row of them, so that each value is a tile that broadcasts as its coordinates say.
Every value is computed in fp32 (integers and booleans keep their type). Strides are the
site's, written into the source: a kernel is proven, and installed behind a guard, for exactly
those layouts.
"""

from __future__ import annotations

from generators.compiler.emit import Coords, ValueEmitter, is_float
from generators.compiler.ir import Cast, Constant, Input, Scan
from generators.triton.expressions import TRITON, tl_dtype

# Combining functions the kernels pass to tl.reduce and tl.associative_scan, each written into
# a candidate that calls it. Maxima and minima keep NaN, as PyTorch's do; the log of a sum of
# exponentials is taken from the larger term, so that it neither overflows nor loses the smaller.
HELPERS = {
    "_times": "def _times(a, b):\n    return a * b\n",
    **{f"_{kind}": (f"def _{kind}(a, b):\n"
                    f"    return tl.{kind}(a, b, propagate_nan=tl.PropagateNan.ALL)\n")
       for kind in ("maximum", "minimum")},
    "_logaddexp": ("def _logaddexp(a, b):\n    top = tl.maximum(a, b)\n"
                   "    low = tl.minimum(a, b)\n"
                   "    return tl.where(low == float(\"-inf\"), top, "
                   "top + tl.log(1.0 + tl.exp(low - top)))\n"),
}
# Each scan kind: what a masked lane holds, and the function combining two running values.
SCAN_NEUTRAL = {"cumsum": "0.0", "cumprod": "1.0", "cummax": "float('-inf')",
                "cummin": "float('inf')", "logcumsumexp": "float('-inf')"}
SCAN_COMBINE = {"cumprod": "_times", "cummax": "_maximum", "cummin": "_minimum",
                "logcumsumexp": "_logaddexp"}


def helpers_for(source: str) -> str:
    """The helper functions `source` calls, as jitted definitions."""
    return "".join(f"@triton.jit\n{text}\n" for name, text in HELPERS.items()
                   if f"{name}(" in source or f", {name})" in source)


class ValueWriter(ValueEmitter):
    language = TRITON
    divide = "//"

    def statement(self, target: str, text: str, kind: str) -> str:
        return f"{target} = {text}"

    def load(self, value: Input, coords: Coords) -> str:
        offset = value.offset(coords)
        mask = self.mask_for(offset.symbols())
        where = f"in{value.index}"
        if offset.terms or offset.constant:
            where += f" + {self.render(offset)}"
        masked = f", mask={mask}, other=0" if mask else ""
        loaded = f"tl.load({where}{masked})"
        if is_float(value.dtype):
            loaded += ".to(tl.float32)"
        return self.let(loaded, "x")

    def constant(self, value: Constant) -> str:
        if is_float(value.dtype):
            return TRITON.const(float(value.value))
        return str(int(value.value))

    def cast(self, value: Cast, source: str) -> str:
        if is_float(value.dtype):
            if not is_float(value.source.dtype) or value.dtype.itemsize >= 4:
                return self.let(f"({source}).to(tl.float32)")
            return self.let(TRITON.round_to(value.dtype, source))
        return self.let(f"({source}).to({tl_dtype(value.dtype)})")

    def scan(self, value: Scan, coords: Coords) -> str:
        """An inclusive scan along the column loop: this block's scan combined with the running
        value of the blocks before it, carried across the loop."""
        neutral = SCAN_NEUTRAL[value.kind]
        source = self.value(value.source, coords)
        kept = self.let(f"tl.where({self.masks['both']}, {source}, {neutral})")
        carry = self.name("carry")
        self.carries.append(f"{carry} = tl.full([BLOCK_ROWS, 1], {neutral}, tl.float32)")
        if value.kind == "cumsum":
            scanned = self.let(f"tl.cumsum({kept}, axis=1) + {carry}")
            self.after.append(f"{carry} = {carry} + tl.sum({kept}, axis=1)[:, None]")
            return scanned
        combine = SCAN_COMBINE[value.kind]
        block = (f"tl.cumprod({kept}, axis=1)" if value.kind == "cumprod"
                 else f"tl.associative_scan({kept}, 1, {combine})")
        scanned = self.let(f"{combine}({block}, {carry})")
        self.after.append(f"{carry} = {combine}({carry}, tl.reduce({kept}, 1, {combine})[:, None])")
        return scanned
