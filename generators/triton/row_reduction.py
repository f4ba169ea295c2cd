"""Tier-1 Triton for `reduction` sites over the last dimension: a block of rows per step.

Each step loads a [ROWS, BLOCK_N] tile (ROWS whole rows), applies the site's elementwise
prologue in registers, then the reduction along the rows (softmax, log_softmax, layer_norm,
rms_norm, sum, mean, amax, amin), then the epilogue, then one store: a single pass over
memory. Inputs of the row's shape (or broadcast to it: per-row scalars, partial broadcasts)
are read through their strides from each row's leading coordinates, so any layout works;
one-dimensional inputs (weights, biases) are the same for every row and are loaded once per
program. A program takes one block of rows, or, when persistent, a few programs per SM stride
over all the blocks, so the loads of one block are in flight while the previous block is
stored. Rows up to MAX_ROW elements fit in registers.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from generators.codegen import SM_COUNT_LINE, indent, op_refs
from generators.site_graph import Op, Ref, SiteGraph, Unsupported
from generators.triton.expressions import elementwise, tl_dtype, with_jit_helpers

MAX_ROW = 32768
# Several rows per program only while the tile stays at 32 fp32 values per thread per live
# tile at 16 warps (16 rows of 1024); a bound by arithmetic, left for the benchmark to refine.
# A single row may be as long as MAX_ROW.
MAX_TILE = 16384
NORMALIZING = ("softmax", "log_softmax", "layer_norm", "rms_norm")
REDUCING = ("sum", "mean", "amax", "amin")


@dataclass(frozen=True)
class RowConfig:
    num_warps: int = 4
    rows: int = 1  # rows per step, reduced together as one [rows, BLOCK_N] tile
    persistent: bool = False  # a few programs per SM loop over the row blocks
    programs_per_sm: int = 4  # how many, when persistent
    num_stages: int = 2  # software pipelining of the persistent loop's loads

    def describe(self) -> str:
        rows = "one row" if self.rows == 1 else f"{self.rows} rows"
        if self.persistent:
            return (f"{self.programs_per_sm} persistent programs per SM, {rows} per step, "
                    f"{self.num_stages} stages, {self.num_warps} warps")
        return f"{rows} per program, {self.num_warps} warps"


_SOURCE = '''"""Kiln rules kernel (triton, reduction): {ops}. {config}."""

import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def row_kernel(
{pointer_params}
    n_rows,
    n_cols,
{size_params}
{stride_params}
    ROWS: tl.constexpr,
    BLOCK_N: tl.constexpr,
    STEPS: tl.constexpr,
):
    cols = tl.arange(0, BLOCK_N)
    col_mask = cols < n_cols
{column_loads}
    for step in {loop}:
        block = tl.program_id(0){widen} + step * tl.num_programs(0)
        rows = block * ROWS + tl.arange(0, ROWS)
        row_mask = rows < n_rows
        mask = row_mask[:, None] & col_mask[None, :]
{coordinates}
{loads}
{prologue}
{reduction}
{epilogue}
{stores}


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, {params}):
        shape = {row_source}.shape
        assert len(shape) == {rank}, "the kernel was written for rank-{rank} rows"
{column_asserts}
        n_cols = shape[-1]
        assert n_cols <= {max_row}, "rows longer than {max_row} need a looped kernel"
{views}
{allocs}
        n_rows = {row_source}.numel() // max(n_cols, 1)
        blocks = triton.cdiv(n_rows, {rows})
{grid}
        # Blocks past the last row are masked off; a compile-time trip count compiles once per
        # launch shape (and the Triton interpreter cannot loop to a runtime bound).
        steps = triton.cdiv(blocks, grid[0])
        row_kernel[grid](
            {pointer_args},
            n_rows,
            n_cols,
            {size_args}
            {stride_args}
            ROWS={rows},
            BLOCK_N=triton.next_power_of_2(n_cols),
            STEPS=steps,
            num_warps={num_warps},
        )
        return {returns}
'''
_GRID = "grid = (max(1, blocks),)"
_PERSISTENT_GRID = "device = {row_source}.device\n" + SM_COUNT_LINE + """
grid = (max(1, min(blocks, {programs_per_sm} * sms)),)"""


def _schedule(config: RowConfig, row_source: str) -> tuple[str, str]:
    """The launch grid's statements and the kernel's loop over row blocks."""
    if not config.persistent:
        return _GRID, "range(STEPS)"
    grid = _PERSISTENT_GRID.format(row_source=row_source, programs_per_sm=config.programs_per_sm)
    return grid, f"tl.range(STEPS, num_stages={config.num_stages})"


def _dim(op: Op) -> object:
    dim = op.kwarg("dim", op.args[1] if len(op.args) > 1 else None)
    return dim[0] if isinstance(dim, tuple) and len(dim) == 1 else dim


def _reduction_body(op: Op, x: str, value: dict[Ref, str], n: str) -> list[str]:
    """Statements computing `y` from the prologue's tile `x`, reducing along its rows (axis 1).

    Row statistics come out as [ROWS] vectors and broadcast back with `[:, None]`. Only the
    columns are masked: rows past the end hold zeros, reduce to finite values and are never
    stored.
    """
    name = op.name
    if name in ("softmax", "log_softmax"):
        lines = [f"m = tl.max(tl.where(col_mask[None, :], {x}, float('-inf')), axis=1)",
                 f"e = tl.where(col_mask[None, :], tl.exp({x} - m[:, None]), 0.0)",
                 "s = tl.sum(e, axis=1)"]
        lines.append("y = e / s[:, None]" if name == "softmax"
                     else f"y = {x} - m[:, None] - tl.log(s)[:, None]")
        return lines
    if name in ("layer_norm", "rms_norm"):
        shape = op.args[1] if len(op.args) > 1 else op.kwarg("normalized_shape")
        if not isinstance(shape, tuple) or len(shape) != 1:
            raise Unsupported("normalization over more than the last dimension")
        weight = op.args[2] if len(op.args) > 2 else op.kwarg("weight")
        if name == "layer_norm":
            bias = op.args[3] if len(op.args) > 3 else op.kwarg("bias")
            eps = op.args[4] if len(op.args) > 4 else op.kwarg("eps", 1e-5)
            lines = [f"mean = tl.sum(tl.where(col_mask[None, :], {x}, 0.0), axis=1) / {n}",
                     f"centered = tl.where(col_mask[None, :], {x} - mean[:, None], 0.0)",
                     f"var = tl.sum(centered * centered, axis=1) / {n}",
                     f"y = centered * tl.rsqrt(var + {float(eps)!r})[:, None]"]
        else:
            bias = None
            eps = op.args[3] if len(op.args) > 3 else op.kwarg("eps")
            if eps is None:
                eps = torch.finfo(op.out.dtype).eps
            lines = [f"ms = tl.sum(tl.where(col_mask[None, :], {x} * {x}, 0.0), axis=1) / {n}",
                     f"y = {x} * tl.rsqrt(ms + {float(eps)!r})[:, None]"]
        if isinstance(weight, Ref):
            lines.append(f"y = y * {value[weight]}")
        if isinstance(bias, Ref):
            lines.append(f"y = y + {value[bias]}")
        return lines
    if name in REDUCING:
        neutral = {"sum": "0.0", "mean": "0.0", "amax": "float('-inf')",
                   "amin": "float('inf')"}[name]
        fold = {"sum": "tl.sum", "mean": "tl.sum", "amax": "tl.max", "amin": "tl.min"}[name]
        lines = [f"y = {fold}(tl.where(col_mask[None, :], {x}, {neutral}), axis=1)"]
        if name == "mean":
            lines.append(f"y = y / {n}")
        return lines
    raise Unsupported(f"no row rule for {name}")


def write_row_reduction(graph: SiteGraph, config: RowConfig) -> str:
    """The ModelNew source computing a last-dimension reduction site with one Triton kernel."""
    anchors = [i for i, op in enumerate(graph.ops) if op.name in NORMALIZING + REDUCING]
    if len(anchors) != 1:
        raise Unsupported(f"{len(anchors)} reductions in the site; the row kernel takes one")
    r = anchors[0]
    anchor = graph.ops[r]
    row_ref = anchor.args[0]
    if not isinstance(row_ref, Ref):
        raise Unsupported("the reduction's input is not a tensor")
    row = graph.info(row_ref)
    rank = len(row.shape)
    dim = _dim(anchor)
    if anchor.name in NORMALIZING[2:]:
        dim = -1
    if dim not in (-1, rank - 1):
        raise Unsupported(f"{anchor.name} over dimension {dim}; the row kernel reduces the last")
    if anchor.name in REDUCING and anchor.kwarg("dtype") is not None:
        raise Unsupported("a reduction with its own accumulation dtype")
    if row.shape and row.shape[-1] > MAX_ROW:
        raise Unsupported(f"rows of {row.shape[-1]} values, longer than the {MAX_ROW} a program "
                          "holds in registers")
    block_n = 1 << max(row.shape[-1] - 1, 0).bit_length() if row.shape else 1
    if config.rows > 1 and config.rows * block_n > MAX_TILE:
        raise Unsupported(f"{config.rows} rows of {block_n} make a tile over {MAX_TILE} "
                          "elements, which spills registers")
    reduced = anchor.name in REDUCING
    for op in graph.ops[:r]:
        if op.kind.value not in ("pointwise", "view") or op.out.shape != row.shape:
            raise Unsupported(f"prologue op {op.name} does not keep the row's shape")
    for op in graph.ops[r + 1:]:
        if op.kind.value not in ("pointwise", "view"):
            raise Unsupported(f"epilogue op {op.name} is not elementwise")

    used = sorted({a.index for op in graph.ops for a in op_refs(op) if a.is_input})
    full = [i for i in used if graph.inputs[i].shape == row.shape]
    if not full:
        raise Unsupported("no input has the row's full shape to size the launch from")
    row_source = f"in{full[0]}"
    for index in used:
        info = graph.inputs[index]
        if not info.dtype.is_floating_point:
            raise Unsupported(f"input in{index} is {info.dtype}: the rules handle float")
        if len(info.shape) > rank:
            raise Unsupported(f"input in{index} has more dimensions than the row")
        if reduced and any(Ref(index, True) in op_refs(op) for op in graph.ops[r + 1:]):
            raise Unsupported("an epilogue reading tensors after a shrinking reduction")
    # A one-dimensional input broadcasts along every leading dimension: the same for all rows.
    columns = [i for i in used if rank > 1 and len(graph.inputs[i].shape) == 1]

    value: dict[Ref, str] = {}
    column_loads, loads = [], []
    for index in used:
        last = f"in{index}_s{rank - 1}"
        if index in columns:
            column_loads.append(f"x{index} = tl.load(in{index}_ptr + cols * {last}, "
                                "mask=col_mask, other=0.0).to(tl.float32)[None, :]")
        else:
            base = " + ".join(f"c{d} * in{index}_s{d}" for d in range(rank - 1)) or "rows * 0"
            loads.append(f"x{index} = tl.load(in{index}_ptr + ({base})[:, None] + cols[None, :] "
                         f"* {last}, mask=mask, other=0.0).to(tl.float32)")
        value[Ref(index, True)] = f"x{index}"
    prologue = []
    for i, op in enumerate(graph.ops[:r]):
        prologue.append(f"v{i} = {elementwise(op, value)}")
        value[Ref(i, False)] = f"v{i}"
    reduction = _reduction_body(anchor, value[row_ref], value, "n_cols")
    value[Ref(r, False)] = "y"
    epilogue = []
    for i, op in enumerate(graph.ops[r + 1:], r + 1):
        epilogue.append(f"v{i} = {elementwise(op, value)}")
        value[Ref(i, False)] = f"v{i}"
    stores, allocs = [], []
    for k, ref in enumerate(graph.outputs):
        info = graph.info(ref)
        after = not ref.is_input and ref.index >= r
        shrunk = after and reduced
        if not shrunk and info.shape != row.shape:
            raise Unsupported("an output that is neither the row's shape nor the reduced one")
        target = (f"out{k}_ptr + rows" if shrunk
                  else f"out{k}_ptr + rows[:, None] * n_cols + cols[None, :]")
        masked = "row_mask" if shrunk else "mask"
        stores.append(f"tl.store({target}, {value[ref]}.to({tl_dtype(info.dtype)}), "
                      f"mask={masked})")
        out_shape = "shape[:-1] + (1,)" if shrunk and _keepdim(anchor) else (
            "shape[:-1]" if shrunk else "shape")
        allocs.append(f"out{k} = torch.empty({out_shape}, device={row_source}.device, "
                      f"dtype={info.dtype})")
    coordinates = ["rest = rows"]
    for d in range(rank - 2, 0, -1):
        coordinates += [f"c{d} = rest % size{d}", f"rest = rest // size{d}"]
    if rank > 1:
        coordinates.append("c0 = rest")
    grid, loop = _schedule(config, row_source)
    return with_jit_helpers(_SOURCE.format(
        ops=" → ".join(op.name for op in graph.ops),
        config=config.describe(),
        pointer_params=indent([f"in{i}_ptr," for i in used]
                               + [f"out{k}_ptr," for k in range(len(graph.outputs))], 4),
        size_params=indent([f"size{d}," for d in range(1, rank - 1)], 4),
        stride_params=indent([f"in{i}_s{d}," for i in used for d in range(rank)], 4),
        column_loads=indent(column_loads, 4),
        loop=loop,
        widen=".to(tl.int64)" if row.numel >= 2**31 else "",
        coordinates=indent(coordinates, 8),
        loads=indent(loads, 8),
        prologue=indent(prologue, 8),
        reduction=indent(reduction, 8),
        epilogue=indent(epilogue, 8),
        stores=indent(stores, 8),
        params=", ".join(f"in{i}" for i in range(len(graph.inputs))),
        row_source=row_source,
        rank=rank,
        column_asserts=indent([f'assert in{i}.dim() == 1, "in{i} was one-dimensional: the '
                               'kernel loads it once for every row"' for i in columns], 8),
        max_row=MAX_ROW,
        views=indent([f"x{i} = in{i}.expand(shape)" for i in used], 8),
        allocs=indent(allocs, 8),
        rows=config.rows,
        grid=indent(grid.splitlines(), 8),
        pointer_args=", ".join([f"x{i}" for i in used]
                               + [f"out{k}" for k in range(len(graph.outputs))]),
        size_args="".join(f"shape[{d}], " for d in range(1, rank - 1)),
        stride_args="".join(f"*x{i}.stride(), " for i in used),
        num_warps=config.num_warps,
        returns=", ".join(f"out{k}" for k in range(len(graph.outputs))),
    ))


def _keepdim(op: Op) -> bool:
    return bool(op.kwarg("keepdim", op.args[2] if len(op.args) > 2 else False))
