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

PROD_HELPER = '''@triton.jit
def _times(a, b):
    return a * b
'''


class ValueWriter(ValueEmitter):
    language = TRITON
    divide = "//"

    def statement(self, target: str, text: str, kind: str) -> str:
        return f"{target} = {text}"

    def load(self, value: Input, coords: Coords) -> str:
        offset = self.offset(value, coords)
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
