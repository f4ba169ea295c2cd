"""Where a compiled CUDA kernel's walk over a row finds its values and puts its outputs: memory a
column at a time, vectors of consecutive columns (one 8- or 16-byte access for 2 or 4 fp32
columns, where an input or output lies along them), or, in a row's later walks, what its first
walk kept on chip (`generators.cuda.compiled` walks the rows).
"""

from __future__ import annotations

import math

import torch

from generators.compiler.emit import Coords
from generators.compiler.index import Expr, Ranges, unit_stride
from generators.compiler.ir import Input
from generators.compiler.plan import Kernel
from generators.cuda.expressions import store_from_float
from generators.cuda.values import CudaValues, element_type

VECTOR_TYPES = {2: "float2", 4: "float4"}


class WalkValues(CudaValues):
    """A row walk's loads and stores. The kernel writer sets the walk's shape: `vector` columns
    a lane a step, `steps` steps a pass, `passes` passes of a kept walk, `kept_columns` a row's
    kept share, `rows_per_block`, and whether the share is kept in `registers`."""

    vector: int
    kept_width: int  # the vector of the kept walks (those over a row's columns)
    steps: int
    passes: int
    kept_columns: int
    rows_per_block: int
    registers: bool

    def __init__(self, kernel: Kernel) -> None:
        super().__init__(kernel)
        # Rows kept: (input index, coordinates) -> its slot; those an earlier walk stored.
        self.kept: dict[tuple[int, Coords], int] = {}
        self.kept_before: set[tuple[int, Coords]] = set()
        self.position: str | None = None  # the walk's place in a kept row, inside a kept walk
        # Inside a walk of vectors: the lines to run before a vector's columns (its loads), those
        # to run after them (its stores), the counters of its first column, the variable
        # counting its columns, and a kept walk's place of its first column; the inputs loaded
        # as vectors, which the forward checks are aligned to them.
        self.before: list[str] | None = None
        self.after_vector: list[str] = []
        self.vector_bound: dict[str, str] = {}
        self.walk_symbols: list[str] = []  # the counters the walk of vectors walks
        self.vector_lane = ""
        self.vector_position = ""
        self.vector_inputs: set[int] = set()

    def load(self, value: Input, coords: Coords) -> str:
        """A value of an input; in a walk of vectors, a vector's load (before its columns) where
        the input lies along it. An input as large as the domain (in whatever shape: a group
        norm's input is its groups' domain viewed), in a kept walk: loaded and kept (in shared
        memory or in registers) by the first walk that reads it at these coordinates, read from
        there by the later ones, which read the same element at the same place of their walk."""
        along = self.along_vector(value.offset(coords), value.dtype)
        if (self.position is None or math.prod(value.shape) != math.prod(self.kernel.domain)
                or not (value.dtype.is_floating_point or value.dtype == torch.bool)):
            return self.lane_of(self.vector_load(value, coords)) if along else super().load(
                value, coords)
        key = (value.index, coords)
        slot = self.kept.setdefault(key, len(self.kept))
        first = slot * self.rows_per_block * self.kept_columns  # the slot's place in `kept`
        if along and not self.registers:
            at = f"&kept[{first} + {self.vector_position}]"
            if key in self.kept_before:
                vector = self.before_vector(f"load_vector<{VECTOR_TYPES[self.vector]}>({at})")
            else:
                vector = self.vector_load(value, coords)
                self.before.append(f"store_vector({at}, {vector});")
            return self.lane_of(vector)
        at = (f"kept{slot}[{self.position}]" if self.registers else
              f"kept[{first} + {self.position}]")
        if key in self.kept_before:
            return self.let(at, "x")
        loaded = (self.lane_of(self.vector_load(value, coords)) if along
                  else super().load(value, coords))
        self.line(f"{at} = {loaded};")
        return loaded

    def along_vector(self, offset: Expr, dtype: torch.dtype) -> bool:
        """Whether, in a walk of vectors, fp32 values at `offset` lie along the vector: its
        columns consecutive in memory from a multiple of the vector's size, at counters bound
        before the vector's loop."""
        if self.before is None or dtype != torch.float32:
            return False
        last = self.walk_symbols[-1]
        walked = self.row_symbols | set(self.walk_symbols)
        return (last in offset.symbols() and offset.symbols() <= walked
                and unit_stride(offset, last, self.vector, Ranges(self.sizes)))

    def vector_load(self, value: Input, coords: Coords) -> str:
        self.vector_inputs.add(value.index)
        offset = self.render(value.offset(coords), self.vector_bound)
        return self.before_vector(f"load_vector<{VECTOR_TYPES[self.vector]}>("
                                  f"&in{value.index}[{offset}])")

    def before_vector(self, text: str) -> str:
        """A vector declared before its columns' loop."""
        vector = self.name("q")
        self.before.append(f"const {VECTOR_TYPES[self.vector]} {vector} = {text};")
        return vector

    def lane_of(self, vector: str) -> str:
        return self.let(f"lane_of({vector}, {self.vector_lane})", "x")

    @property
    def kept_bytes(self) -> int:
        """The dynamic shared memory a block's kept rows take."""
        if self.registers:
            return 0
        return 4 * len(self.kept) * self.rows_per_block * self.kept_columns

    @property
    def kept_registers(self) -> int:
        """The values a thread keeps in registers."""
        return len(self.kept) * self.passes * self.steps * self.kept_width if self.registers else 0

    def store(self, index: int, guard: str, offset: Expr | str) -> None:
        """Output `index`'s value at `offset`; in a walk of vectors, where the output lies
        along the vector, set in a vector stored after its columns."""
        output = self.kernel.graph.outputs[index]
        value = self.value(output, tuple(self.kernel.output_coords(index)))
        if output.dtype.is_floating_point or str(output.dtype) == "torch.bool":
            text = store_from_float(output.dtype, value)
        else:
            text = f"({element_type(output.dtype)})({value})"
        if isinstance(offset, Expr) and self.along_vector(offset, output.dtype):
            vector = self.name("o")
            self.before.append(f"{VECTOR_TYPES[self.vector]} {vector};")
            self.line(f"set_lane({vector}, {self.vector_lane}, {text});")
            at = self.render(offset, self.vector_bound)
            self.after_vector.append(f"if ({guard}) {{ store_vector(&out{index}[{at}], "
                                     f"{vector}); }}")
            return
        at = self.render(offset) if isinstance(offset, Expr) else offset
        self.line(f"if ({guard}) {{ out{index}[{at}] = {text}; }}")
