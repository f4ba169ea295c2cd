"""The compiler's IR values written as CUDA C++: each thread computes scalars for one row and one
column at a time.

Every float value is a `float` register (integers `long long`, booleans 0.0 or 1.0), as the op
table writes it (`generators.cuda.expressions`). Rows past the end read a clamped row, so that
every thread of a block takes part in the block's folds; only stores are guarded. Strides are the
site's, written into the source. A kernel's lines go out without the declarations nothing reads
(`without_unused`).
"""

from __future__ import annotations

import re

import torch

from generators.compiler.emit import Coords, ValueEmitter, is_float, unread_dropped
from generators.compiler.ir import Cast, Constant, Input, Scan
from generators.compiler.plan import Kernel
from generators.cuda.expressions import CUDA, load_as_float, storage_type
from generators.site_graph import Unsupported

_C_TYPES = {"float": "float", "int": "long long"}
_INTEGER_STORAGE = {torch.int64: "long long", torch.int32: "int", torch.int16: "short",
                    torch.uint8: "unsigned char", torch.int8: "signed char"}


def element_type(dtype: torch.dtype) -> str:
    """How a tensor of `dtype` is stored: its C element type."""
    if dtype in _INTEGER_STORAGE:
        return _INTEGER_STORAGE[dtype]
    return storage_type(dtype)


class CudaValues(ValueEmitter):
    language = CUDA
    divide = "/"

    def __init__(self, kernel: Kernel) -> None:
        super().__init__(kernel)
        # 32-bit counters where every offset fits: a 64-bit division costs several times more.
        self.index = "long long" if self.wide else "int"

    def statement(self, target: str, text: str, kind: str) -> str:
        return f"const {self.index if kind == 'index' else _C_TYPES[kind]} {target} = {text};"

    def load(self, value: Input, coords: Coords) -> str:
        offset = value.offset(coords)
        element = f"in{value.index}[{self.render(offset)}]"
        if is_float(value.dtype) or value.dtype == torch.bool:
            return self.let(load_as_float(value.dtype, element), "x")
        return self.let(f"(long long){element}", "x", "int")

    def constant(self, value: Constant) -> str:
        if is_float(value.dtype) or value.dtype == torch.bool:
            return CUDA.const(float(value.value))
        return f"{int(value.value)}LL"

    def cast(self, value: Cast, source: str) -> str:
        if is_float(value.dtype):
            if not is_float(value.source.dtype) or value.dtype.itemsize >= 4:
                return self.let(f"(float)({source})")
            return self.let(CUDA.round_to(value.dtype, source))
        if value.dtype == torch.bool:
            return self.let(f"(({source}) != 0 ? 1.0f : 0.0f)")
        return self.let(f"(long long)({source})", kind="int")

    def scan(self, value: Scan, coords: Coords) -> str:
        """An inclusive scan of the lanes' consecutive columns, plus the total carried from the
        blocks of columns before (lanes of a row are one warp's: the kernel plans it so)."""
        if value.kind != "cumsum":
            raise Unsupported(f"{value.kind} in the CUDA tier (its scans are sums)")
        source = self.value(value.source, coords)
        carry = self.name("carry")
        self.carries.append(f"float {carry} = 0.0f;")
        running = self.name("scan")
        inside = self.masks["both"]
        self.line(f"float {running} = " + (f"{inside} ? {source} : 0.0f;" if inside != "true"
                                           else f"{source};"))
        self.line("for (int hop = 1; hop < LANES; hop <<= 1) {")
        self.line(f"    const float before = __shfl_up_sync(0xffffffffu, {running}, hop, LANES);")
        self.line(f"    if (lane >= hop) {{ {running} += before; }}")
        self.line("}")
        scanned = self.let(f"{running} + {carry}")
        self.after.append(f"{carry} += __shfl_sync(0xffffffffu, {running}, LANES - 1, LANES);")
        return scanned


# A `const` value, or a `__shared__` array, declared alone on its line.
_DECLARATION = re.compile(r"^\s*(?:const|__shared__) [\w ]+? (\w+)(?: = [^;]*|\[[^\];]*\]);$")


def without_unused(lines: list[str]) -> list[str]:
    """`lines` less the `const` values and `__shared__` arrays nothing reads: nvcc warns of
    each, and a reader looks for its use."""
    return unread_dropped(lines, _DECLARATION, "//")
