"""A matmul site's reduction over its output's rows, for the Triton matmul kernel.

The matmul kernel's tiles hold BLOCK_N columns of BLOCK_M rows: each tile reduces its columns to
one partial value a row (`partial_lines`) and stores it, so the matmul's output is never written
for the reduction's sake. A second, small kernel (`ROW_KERNEL`) reduces each row's partials by the
same rule (a sum of sums, a max of maxes, a logsumexp of logsumexps), then runs the ops the site
applies to the reduced rows and stores them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from generators.codegen import op_refs
from generators.site_graph import Op, Ref, SiteGraph, Unsupported
from generators.triton.expressions import elementwise, tl_dtype
from generators.triton.matmul_anchor import IDENTITY_VIEWS, SHAPE_VIEWS, viewed

# The reductions the tiles take, the value a masked element holds for each, and how the
# partials fold (mean folds as a sum, divided by the row's length at the end).
NEUTRAL = {"sum": "0.0", "mean": "0.0", "amax": "float('-inf')", "amin": "float('inf')",
           "logsumexp": "float('-inf')"}
_FOLD = {"sum": "tl.sum", "mean": "tl.sum", "amax": "tl.max", "amin": "tl.min"}
_MERGE = {"sum": "accs + {}", "mean": "accs + {}", "amax": "tl.maximum(accs, {})",
          "amin": "tl.minimum(accs, {})"}
# Rows a program of the row kernel combines, and partials it reads a step.
BLOCK_ROWS = 32
BLOCK_TILES = 64

ROW_KERNEL = '''

@triton.jit
def row_kernel(
    part_ptr,
{params}
    ROWS, COLUMNS,
    TILES: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_T: tl.constexpr,
):
    # Each row's partials, one per column tile of the matmul, reduced to the row's value.
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    row_mask = rows < ROWS
{combine}
{body}
'''


def reduced_dims(op: Op, rank: int) -> tuple[int, ...]:
    dim = op.kwarg("dim", op.args[1] if len(op.args) > 1 else None)
    if dim is None:
        raise Unsupported(f"{op.name} of every element: the matmul's tiles reduce rows")
    dims = dim if isinstance(dim, tuple | list) else (dim,)
    return tuple(sorted({int(d) % rank for d in dims}))


def keeps_dims(op: Op) -> bool:
    return bool(op.kwarg("keepdim", op.args[2] if len(op.args) > 2 else False))


def partial_lines(kind: str, tile: str) -> list[str]:
    """Kernel lines reducing the tile value `tile` over its columns into `part`, one a row."""
    masked = f"tl.where(mask, {tile}, {NEUTRAL[kind]})"
    if kind != "logsumexp":
        return [f"part = {_FOLD[kind]}({masked}, axis=1)"]
    # An infinite maximum would make x - max a NaN: the sum of exponentials is taken around
    # zero instead, which gives the same infinity.
    return [f"top = tl.max({masked}, axis=1)",
            "top = tl.where(tl.abs(top) == float('inf'), 0.0, top)",
            f"part = top + tl.log(tl.sum(tl.where(mask, tl.exp({tile} - top[:, None]), 0.0), "
            "axis=1))"]


def _combine_lines(kind: str) -> list[str]:
    load = ("parts = tl.load(part_ptr + rows[:, None] * TILES + tiles[None, :],\n"
            "                mask=row_mask[:, None] & (tiles < TILES)[None, :], other={})")

    # Each step merges its partials into a [BLOCK_R, BLOCK_T] accumulator elementwise, and the
    # rows are folded once after the loop: Triton 3.6's thread-locality pass fails to compile a
    # loop that carries a row's folded value across more than one step, on sm_90 (bench/NOTES.md,
    # 2026-12-05, 11:50-12:10 UTC).
    def walk(start: str, merge: str, fold: str, neutral: str) -> list[str]:
        return [f"accs = tl.full((BLOCK_R, BLOCK_T), {start}, tl.float32)",
                "for t0 in range(0, TILES, BLOCK_T):",
                "    tiles = t0 + tl.arange(0, BLOCK_T)",
                *("    " + line for line in load.format(neutral).splitlines()),
                f"    accs = {merge}",
                f"acc = {fold}(accs, axis=1)"]

    if kind == "logsumexp":
        return [*walk("float('-inf')", "tl.maximum(accs, parts)", "tl.max", "float('-inf')"),
                "top = tl.where(tl.abs(acc) == float('inf'), 0.0, acc)",
                *walk("0.0", "accs + tl.exp(parts - top[:, None])", "tl.sum", "float('-inf')"),
                "r = top + tl.log(acc)"]
    lines = walk(NEUTRAL[kind], _MERGE[kind].format("parts"), _FOLD[kind], NEUTRAL[kind])
    return [*lines, "r = acc / COLUMNS" if kind == "mean" else "r = acc"]


@dataclass
class RowReduction:
    """The site's reduction of a matmul tile value over its rows and the ops after it: what the
    row kernel loads, computes and stores, and the forward lines around it."""

    graph: SiteGraph
    kind: str
    source: Ref  # the tile value reduced
    value: dict[Ref, str] = field(default_factory=dict)  # reduced values in the row kernel
    stage: dict[Ref, str] = field(default_factory=dict)  # their forward stand-ins (meta tensors)
    stages: list[str] = field(default_factory=list)
    operands: dict[tuple[int, str], str] = field(default_factory=dict)
    operand_lines: list[str] = field(default_factory=list)
    loads: list[str] = field(default_factory=list)
    body: list[str] = field(default_factory=list)

    @staticmethod
    def start(graph: SiteGraph, index: int, tile_stage: dict[Ref, str]) -> RowReduction:
        op = graph.ops[index]
        source = op.args[0] if op.args else None
        if not isinstance(source, Ref) or source.is_input or op.name not in NEUTRAL:
            raise Unsupported(f"{op.name} of the matmul's output: the tiles reduce with "
                              f"{', '.join(NEUTRAL)}")
        rank = len(graph.info(source).shape)
        if reduced_dims(op, rank) != (rank - 1,) or op.kwarg("dtype") is not None:
            raise Unsupported(f"{op.name} over more than the matmul's columns")
        rows = RowReduction(graph, op.name, source)
        at = tile_stage[source]
        kept = f"(*{at}.shape[:-1], 1)" if keeps_dims(op) else f"{at}.shape[:-1]"
        rows._stage_of(index, f"torch.empty({kept}, device='meta')")
        rows.value[Ref(index, False)] = "r"
        return rows

    def _stage_of(self, index: int, line: str) -> None:
        self.stage[Ref(index, False)] = f"stage{index}"
        self.stages.append(f"stage{index} = {line}")

    def add(self, index: int, op: Op) -> None:
        """Take op `index`, which reads a reduced value: a view, an identity, a reduction over
        dimensions of size one (the value itself), or an elementwise op on the rows."""
        here = Ref(index, False)
        chain = [r for r in op.args if isinstance(r, Ref) and not r.is_input]
        at = self.stage[chain[0]]
        if op.name in SHAPE_VIEWS:
            self._stage_of(index, viewed(op, at))
            self.value[here] = self.value[chain[0]]
            return
        if op.name in IDENTITY_VIEWS:
            self.stage[here], self.value[here] = at, self.value[chain[0]]
            return
        if op.kind.value == "reduction":
            rank = len(self.graph.info(chain[0]).shape)
            dims = reduced_dims(op, rank)
            if any(self.graph.info(chain[0]).shape[d] != 1 for d in dims):
                raise Unsupported(f"{op.name} across the matmul's rows")
            size = "1 if d in {0} else s" if keeps_dims(op) else "s"
            keep = "" if keeps_dims(op) else f" if d not in {dims}"
            self._stage_of(index, f"torch.empty([{size.format(dims)} for d, s in "
                                  f"enumerate({at}.shape){keep}], device='meta')")
            self.value[here] = self.value[chain[0]]
            return
        if op.name == "getitem" and len(op.args) == 2 and op.args[1] in (0, 1):
            # A pick of max or min along a dimension of size one: the value, or index 0.
            self.stage[here] = at
            self.value[here] = (self.value[chain[0]] if op.args[1] == 0
                                else "tl.zeros((BLOCK_R,), dtype=tl.int64)")
            return
        if op.kind.value != "pointwise":
            raise Unsupported(f"{op.name} of the reduced rows is not elementwise")
        for ref in op_refs(op):
            if ref.is_input:
                if not self.graph.inputs[ref.index].dtype.is_floating_point:
                    raise Unsupported(f"input {ref.name} is {self.graph.inputs[ref.index].dtype}")
                self.value[ref] = self._load(ref, at)
            elif ref not in self.value:
                raise Unsupported(f"{op.name} of the reduced rows reads {ref.name}, which the "
                                  "row kernel does not compute")
        self.body.append(f"v{index} = {elementwise(op, self.value)}")
        self.value[here], self.stage[here] = f"v{index}", at

    def _load(self, ref: Ref, at: str) -> str:
        key = (ref.index, at)
        if key not in self.operands:
            name = f"f{len(self.operands)}"
            self.operands[key] = name
            self.operand_lines.append(f"{name} = {ref.name}.expand({at}.shape).reshape(-1)")
            self.loads.append(f"{name} = tl.load({name}_ptr + rows * {name}_s, "
                              "mask=row_mask).to(tl.float32)")
        return self.operands[key]

    def kernel(self, outputs: list[Ref]) -> str:
        """The row kernel's source, storing `outputs` (reduced values) as row_out0, 1, ..."""
        names = list(self.operands.values())
        params = [f"{n}_ptr, {n}_s," for n in names] + [f"row_out{k}_ptr,"
                                                         for k in range(len(outputs))]
        stores = [f"tl.store(row_out{k}_ptr + rows, {self.value[ref]}.to("
                  f"{tl_dtype(self.graph.info(ref).dtype)}), mask=row_mask)"
                  for k, ref in enumerate(outputs)]
        return ROW_KERNEL.format(
            params="\n".join("    " + p for p in params),
            combine="\n".join("    " + line for line in _combine_lines(self.kind)),
            body="\n".join("    " + line for line in self.loads + self.body + stores))

    def launch(self, outputs: list[Ref], block_n: int) -> list[str]:
        """Forward lines: the row outputs' buffers and the row kernel's launch, after the
        matmul kernel has filled `part`."""
        allocs = [f"row_out{k} = torch.empty((rows_total,), device=a.device, "
                  f"dtype={self.graph.info(ref).dtype})" for k, ref in enumerate(outputs)]
        args = [f"{n}, {n}.stride(0)" for n in self.operands.values()]
        args += [f"row_out{k}" for k in range(len(outputs))]
        return [*self.operand_lines, *allocs,
                f"row_kernel[(triton.cdiv(rows_total, {BLOCK_ROWS}),)](",
                f"    part, {', '.join(args)}," if args else "    part,",
                "    rows_total, N,",
                f"    TILES=triton.cdiv(N, {block_n}), BLOCK_R={BLOCK_ROWS},",
                f"    BLOCK_T=min(triton.next_power_of_2(triton.cdiv(N, {block_n})), "
                f"{BLOCK_TILES}),",
                ")"]
