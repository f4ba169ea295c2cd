"""Tier-1 Triton for sum, mean, amax and amin over a dimension that is not the last.

The input is viewed as [outer, reduced, inner]: each program owns one outer index and BLOCK_I
consecutive inner columns, walks the reduced dimension BLOCK_R rows at a time with every load
coalesced along the inner columns, and applies the site's elementwise prologue (on the input's
shape) and epilogue (on the result) in registers: one read of the input, one write of the
result. The reduced extent is a compile-time constant (each size compiles once).
"""

from __future__ import annotations

from dataclasses import dataclass

from generators.codegen import indent, op_refs
from generators.expressions import elementwise, tl_dtype
from generators.site_graph import Ref, SiteGraph, Unsupported

FOLDS = {"sum": ("tl.sum", "0.0", "+"), "mean": ("tl.sum", "0.0", "+"),
         "amax": ("tl.max", "float('-inf')", "max"), "amin": ("tl.min", "float('inf')", "min")}


@dataclass(frozen=True)
class DimConfig:
    block_r: int = 16
    block_i: int = 128
    num_warps: int = 4

    def describe(self) -> str:
        return f"{self.block_r}×{self.block_i} tiles over (reduced, inner), {self.num_warps} warps"


_SOURCE = '''"""Kiln rules kernel (triton, reduction over dim {dim}): {ops}. {config}."""

import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def dim_kernel(
{pointer_params}
    inner,
    REDUCED: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_I: tl.constexpr,
):
    outer = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK_I + tl.arange(0, BLOCK_I)
    col_mask = cols < inner
    acc = tl.full((BLOCK_I,), {neutral}, tl.float32)
    for start in range(0, REDUCED, BLOCK_R):
        rows = start + tl.arange(0, BLOCK_R)
        mask = (rows < REDUCED)[:, None] & col_mask[None, :]
        offsets = outer * REDUCED * inner + rows[:, None] * inner + cols[None, :]
{loads}
{prologue}
        tile = tl.where(mask, {reduced_value}, {neutral})
        acc = {combine}
    y = acc{scale}
{epilogue}
{stores}


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, {params}):
        shape = {row_source}.shape
        assert len(shape) == {rank}, "the kernel was written for rank-{rank} inputs"
{contiguity}
        outer = 1
        for size in shape[:{dim}]:
            outer *= size
        inner = 1
        for size in shape[{dim} + 1:]:
            inner *= size
        out_shape = {out_shape}
{allocs}
        grid = (outer, triton.cdiv(inner, {block_i}))
        dim_kernel[grid](
            {pointer_args},
            inner,
            REDUCED=shape[{dim}],
            BLOCK_R={block_r},
            BLOCK_I={block_i},
            num_warps={num_warps},
        )
        return {returns}
'''


def write_dim_reduction(graph: SiteGraph, config: DimConfig) -> str:
    """ModelNew for a site whose one reduction folds a dimension other than the last."""
    anchors = [i for i, op in enumerate(graph.ops) if op.name in FOLDS]
    if len(anchors) != 1 or len([o for o in graph.ops if o.kind.value == "reduction"]) != 1:
        raise Unsupported("the dimension kernel takes exactly one sum, mean, amax or amin")
    r = anchors[0]
    anchor = graph.ops[r]
    source_ref = anchor.args[0]
    row = graph.info(source_ref)
    rank = len(row.shape)
    dim = anchor.kwarg("dim", anchor.args[1] if len(anchor.args) > 1 else None)
    if isinstance(dim, tuple) and len(dim) == 1:
        dim = dim[0]
    if not isinstance(dim, int):
        raise Unsupported(f"{anchor.name} over {dim!r}: the kernel folds one dimension")
    dim %= rank
    if dim == rank - 1:
        raise Unsupported("a last-dimension reduction belongs to the row kernel")
    if anchor.kwarg("dtype") is not None:
        raise Unsupported("a reduction with its own accumulation dtype")
    keepdim = bool(anchor.kwarg("keepdim", anchor.args[2] if len(anchor.args) > 2 else False))
    used = sorted({a.index for op in graph.ops for a in op_refs(op) if a.is_input})
    for index in used:
        info = graph.inputs[index]
        if info.shape != row.shape or not info.dtype.is_floating_point:
            raise Unsupported(f"input in{index} is not a float tensor of the reduced input's "
                              "shape")
    for op in graph.ops[:r]:
        if op.kind.value != "pointwise" or op.out.shape != row.shape:
            raise Unsupported(f"prologue op {op.name} does not keep the input's shape")
    for op in graph.ops[r + 1:]:
        if op.kind.value != "pointwise" or any(ref.is_input for ref in op_refs(op)):
            raise Unsupported(f"epilogue op {op.name} reads more than the reduced value")
    if len(graph.outputs) != 1 or graph.outputs[0].is_input or graph.outputs[0].index < r:
        raise Unsupported("the site returns more than the reduced result")

    value: dict[Ref, str] = {}
    loads = []
    for index in used:
        loads.append(f"x{index} = tl.load(in{index}_ptr + offsets, mask=mask, "
                     "other=0.0).to(tl.float32)")
        value[Ref(index, True)] = f"x{index}"
    prologue = []
    for i, op in enumerate(graph.ops[:r]):
        prologue.append(f"v{i} = {elementwise(op, value)}")
        value[Ref(i, False)] = f"v{i}"
    fold, neutral, join = FOLDS[anchor.name]
    combine = (f"acc + {fold}(tile, axis=0)" if join == "+"
               else f"tl.{'maximum' if join == 'max' else 'minimum'}(acc, {fold}(tile, axis=0))")
    value[Ref(r, False)] = "y"
    epilogue = []
    for i, op in enumerate(graph.ops[r + 1:], r + 1):
        epilogue.append(f"v{i} = {elementwise(op, value)}")
        value[Ref(i, False)] = f"v{i}"
    result = graph.outputs[0]
    out_dtype = tl_dtype(graph.info(result).dtype)
    row_source = f"in{used[0]}"
    out_shape = (f"shape[:{dim}] + (1,) + shape[{dim} + 1:]" if keepdim
                 else f"shape[:{dim}] + shape[{dim} + 1:]")
    return _SOURCE.format(
        dim=dim, ops=" → ".join(op.name for op in graph.ops), config=config.describe(),
        pointer_params=indent([f"in{i}_ptr," for i in used] + ["out0_ptr,"], 4),
        neutral=neutral, loads=indent(loads, 8), prologue=indent(prologue, 8),
        reduced_value=value[source_ref], combine=combine,
        scale=" / REDUCED" if anchor.name == "mean" else "",
        epilogue=indent(epilogue, 4),
        stores=indent([f"tl.store(out0_ptr + outer * inner + cols, "
                       f"{value[result]}.to({out_dtype}), mask=col_mask)"], 4),
        params=", ".join(f"in{i}" for i in range(len(graph.inputs))),
        row_source=row_source, rank=rank,
        contiguity=indent([f'assert in{i}.is_contiguous(), "in{i} must be contiguous"'
                           for i in used], 8),
        out_shape=out_shape,
        allocs=indent([f"out0 = torch.empty(out_shape, device={row_source}.device, "
                       f"dtype={graph.info(result).dtype})"], 8),
        block_i=config.block_i, block_r=config.block_r, num_warps=config.num_warps,
        pointer_args=", ".join([f"in{i}" for i in used] + ["out0"]),
        returns="out0",
    )

