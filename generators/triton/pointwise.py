"""Tier-1 Triton for `pointwise` sites: one pass over the output, the whole chain in registers.

The output is viewed as rows × columns, decided per call from the real layouts: adjacent dims
that every tensor walks as one are merged, the innermost merged dim is the columns and the
others are row dims. Each program owns a BLOCK_R × BLOCK_C tile. A row's coordinates are
decomposed once per row (a division and a remainder per row dim, amortized over the row's
columns) and every tensor is then walked along the columns with one stride; no element pays
for a division. The patterns that matter fall out of the merge:
- inputs laid out like the output merge into one flat row: the plain one-dimensional pass;
- a bias (N,) over (M, N) leaves rows M × columns N: the bias is read at the column, the same
  addresses for every row, with no division at all;
- a column scale (M, 1), or a channel vector (1, C, 1, 1) over (B, C, H, W) (rows B·C,
  columns H·W), is constant along a row: it is loaded once per row (`ROW_ONLY_i`, a constexpr)
  and broadcast across the tile, so a conv or batch-norm epilogue reads its per-channel
  parameters once per channel row and everything else linearly;
- a scalar-like (1, 1) input is one value per row of the flat pass;
- a transposed or otherwise strided input still has a column stride and row strides: the
  general path, right for every layout (a transposed input's reads are simply not coalesced).

Why a 2-D tile over offsets taken modulo the inner size (`offsets % N`): the tile costs no
per-element integer division, and Triton sees each column run as contiguous and (when the
sizes and strides are multiples of 16, which it specializes on) aligned, so loads and stores
stay 16-byte vectors; a column stride of 1 is specialized into a constant, so contiguous
inputs need no flag of their own. Tile widths are powers of two chosen per call: the widest
(at most BLOCK, at least 32) that pads a row by at most an eighth, the rest of BLOCK in rows,
so short rows (a 7×7 feature map) still fill a program.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from generators.codegen import BROADCAST_SHAPE_HELPER, ROWS_AND_COLUMNS_HELPER, indent, op_refs
from generators.op_table import channel_aligned_inputs
from generators.site_graph import Ref, SiteGraph, Unsupported
from generators.triton.expressions import elementwise, tl_dtype, with_jit_helpers


@dataclass(frozen=True)
class PointwiseConfig:
    block: int = 1024  # elements per program: BLOCK_R × BLOCK_C
    num_warps: int = 4

    def describe(self) -> str:
        return f"BLOCK {self.block}, {self.num_warps} warps"


_SOURCE = '''"""{title}"""

import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def pointwise_kernel(
{pointer_params}
    n_rows,
    n_cols,
    col_tiles,
{size_params}
{stride_params}
{flag_params}
    WIDE: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_C: tl.constexpr,
):
    # One BLOCK_R × BLOCK_C tile of the output viewed as n_rows × n_cols.
    tile = tl.program_id(0)
    if WIDE:
        tile = tile.to(tl.int64)
    rows = (tile // col_tiles) * BLOCK_R + tl.arange(0, BLOCK_R)
    cols = (tile % col_tiles) * BLOCK_C + tl.arange(0, BLOCK_C)
    row_mask = rows < n_rows
    mask = row_mask[:, None] & (cols < n_cols)[None, :]
    # Each row's coordinates over the row dims: divisions per row, none per element.
{coordinates}
{loads}
{body}
    out_offsets = rows[:, None] * n_cols + cols[None, :]
{stores}


{broadcast_helper}

{rows_helper}

def _tile(n_rows, n_cols, block):
    """Rows × columns of one program's tile, powers of two, at most `block` elements: the
    widest columns (32 at least) that pad a row by at most an eighth, the rest in rows."""
    widest = min(block, triton.next_power_of_2(n_cols))
    widths = [w for w in (widest >> i for i in range(widest.bit_length()))
              if w >= min(widest, 32)]
    block_c = next((w for w in widths if (-n_cols) % w <= n_cols // 8), widest)
    return min(block // block_c, triton.next_power_of_2(n_rows)), block_c


class {class_name}(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, {params}):
{aligned}        shape = _broadcast_shape([{shapes}])
        assert len(shape) == {rank}, "the kernel was written for rank-{rank} outputs"
{views}
{allocs}
        if out0.numel() == 0:
            return {returns}
        sizes, n_cols, strides, wide = _rows_and_columns(shape, [{strides}], {row_dims})
        n_rows = out0.numel() // n_cols
        block_r, block_c = _tile(n_rows, n_cols, {block})
        col_tiles = triton.cdiv(n_cols, block_c)
        grid = (triton.cdiv(n_rows, block_r) * col_tiles,)
        pointwise_kernel[grid](
            {pointer_args},
            n_rows, n_cols, col_tiles, *sizes,
            {stride_args},
            {flag_args},
            WIDE=wide, BLOCK_R=block_r, BLOCK_C=block_c,
            num_warps={num_warps},
        )
        return {returns}
'''


def _load(index: int, dtype: torch.dtype, row_dims: int) -> list[str]:
    """Input `index` into registers: once per row when constant along the columns."""
    convert = ".to(tl.float32)" if dtype.is_floating_point else ""
    row = f"in{index}_row"
    return [
        f"{row} = " + " + ".join(f"r{d} * in{index}_r{d}" for d in range(row_dims)),
        f"if ROW_ONLY_{index}:",
        f"    x{index} = tl.load(in{index}_ptr + {row}, mask=row_mask)[:, None]{convert}",
        "else:",
        f"    x{index} = tl.load(in{index}_ptr + {row}[:, None] + cols[None, :] * in{index}_c, "
        f"mask=mask){convert}",
    ]


def _coordinates(row_dims: int) -> list[str]:
    if row_dims == 1:
        return ["r0 = rows"]
    lines = ["rest = rows"]
    for d in range(row_dims - 1, 0, -1):
        lines += [f"r{d} = rest % size{d}", f"rest = rest // size{d}"]
    return lines + ["r0 = rest"]


def write_pointwise(graph: SiteGraph, config: PointwiseConfig, class_name: str = "ModelNew",
                    title: str | None = None) -> str:
    """The source of module `class_name` computing `graph` with one Triton kernel.

    Other writers embed it under another name (a conv's epilogue) with their own title.
    """
    out = graph.info(graph.outputs[0])
    rank = len(out.shape)
    if rank == 0:
        raise Unsupported("a zero-dimensional result is not worth a kernel")
    for ref in graph.outputs:
        if graph.info(ref).shape != out.shape:
            raise Unsupported("outputs of different shapes")
    used = sorted({a.index for op in graph.ops for a in op_refs(op) if a.is_input})
    if not used:
        raise Unsupported("the site reads no tensor")
    for index in used:
        dtype = graph.inputs[index].dtype
        if not (dtype.is_floating_point or dtype == torch.bool):
            raise Unsupported(f"input in{index} is {dtype}: the rules handle float and bool")
    aligned = {r.index for op in graph.ops for r in channel_aligned_inputs(op) if r.is_input}
    row_dims = max(rank - 1, 1)

    value: dict[Ref, str] = {}
    loads, body = [], []
    for index in used:
        loads += _load(index, graph.inputs[index].dtype, row_dims)
        value[Ref(index, True)] = f"x{index}"
    for i, op in enumerate(graph.ops):
        if op.kind.value not in ("pointwise", "view"):
            raise Unsupported(f"{op.name} is not elementwise")
        body.append(f"v{i} = {elementwise(op, value)}")
        value[Ref(i, False)] = f"v{i}"
    stores = []
    for k, ref in enumerate(graph.outputs):
        dtype = graph.info(ref).dtype
        stores.append(f"tl.store(out{k}_ptr + out_offsets, {value[ref]}.to({tl_dtype(dtype)}), "
                      "mask=mask)")

    pointer_params = [f"in{i}_ptr," for i in used] + [f"out{k}_ptr,"
                                                      for k in range(len(graph.outputs))]
    stride_params = [" ".join([f"in{i}_r{d}," for d in range(row_dims)] + [f"in{i}_c,"])
                     for i in used]
    shapes = ", ".join(f"x{i}.shape" if i in aligned else f"in{i}.shape" for i in used)
    views = [f"x{i} = {'x' if i in aligned else 'in'}{i}.expand(shape)" for i in used]
    aligned_views = [f"x{i} = in{i}.reshape([1, -1] + [1] * ({rank} - 2))" for i in sorted(aligned)]
    allocs = [
        f"out{k} = torch.empty(shape, device=in{used[0]}.device, "
        f"dtype={graph.info(ref).dtype})" for k, ref in enumerate(graph.outputs)
    ]
    ops = " → ".join(op.name for op in graph.ops)
    return with_jit_helpers(_SOURCE.format(
        broadcast_helper=BROADCAST_SHAPE_HELPER,
        rows_helper=ROWS_AND_COLUMNS_HELPER,
        title=title or f"Kiln rules kernel (triton, pointwise): {ops}. {config.describe()}.",
        class_name=class_name,
        pointer_params=indent(pointer_params, 4),
        size_params=indent([" ".join(f"size{d}," for d in range(row_dims))], 4),
        stride_params=indent(stride_params, 4),
        flag_params=indent([f"ROW_ONLY_{i}: tl.constexpr," for i in used], 4),
        coordinates=indent(_coordinates(row_dims), 4),
        loads=indent(loads, 4),
        body=indent(body, 4),
        stores=indent(stores, 4),
        params=", ".join(f"in{i}" for i in range(len(graph.inputs))),
        aligned="".join(f"        {line}\n" for line in aligned_views),
        shapes=shapes,
        rank=rank,
        views=indent(views, 8),
        allocs=indent(allocs, 8),
        strides=", ".join(f"x{i}.stride()" for i in used),
        row_dims=row_dims,
        block=config.block,
        pointer_args=", ".join([f"x{i}" for i in used]
                               + [f"out{k}" for k in range(len(graph.outputs))]),
        stride_args=", ".join(f"*strides[{t}]" for t in range(len(used))),
        flag_args=", ".join(f"ROW_ONLY_{i}=strides[{t}][-1] == 0" for t, i in enumerate(used)),
        num_warps=config.num_warps,
        returns=", ".join(f"out{k}" for k in range(len(graph.outputs))),
    ))
