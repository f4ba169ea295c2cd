"""Tier-1 Triton for softmax and log_softmax over a dimension that is not the last.

The input is viewed as [outer, reduced, inner] (channels of an NCHW tensor: outer = N,
reduced = C, inner = H·W): each program owns one outer index and BLOCK_I consecutive inner
columns, so every load is coalesced along the inner columns and the statistics are per column.
When the whole reduced extent fits one [BLOCK_R, BLOCK_I] tile of registers the program loads
it once, normalizes and stores: one read, one write. Otherwise it walks the reduced rows
keeping a running maximum and a sum rescaled to it (online softmax), then walks them again to
write. The site's elementwise prologue and epilogue run in registers; epilogue ops may read
other inputs of the same shape.
"""

from __future__ import annotations

from dataclasses import dataclass

from generators.codegen import indent, op_refs
from generators.site_graph import Ref, SiteGraph, Unsupported
from generators.triton.dim_reduction import folded_dim, full_shape_inputs
from generators.triton.expressions import elementwise, tl_dtype, with_jit_helpers

SOFTMAXES = ("softmax", "log_softmax")


@dataclass(frozen=True)
class DimSoftmaxConfig:
    block_i: int = 32  # inner columns per program, at least; widened when the reduced dim is short
    tile: int = 8192  # the most elements of one [BLOCK_R, BLOCK_I] tile held in registers
    num_warps: int = 8

    def describe(self) -> str:
        return (f"tiles of up to {self.tile} elements, at least {self.block_i} inner columns "
                f"per program, {self.num_warps} warps")


_SOURCE = '''"""Kiln rules kernel (triton, {name} over dim {dim}): {ops}. {config}."""

import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def softmax_kernel(
{pointer_params}
    inner,
    REDUCED: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_I: tl.constexpr,
):
    # One flat grid axis over (outer, column tile): either count may pass 65535.
    tiles_per_outer = tl.cdiv(inner, BLOCK_I)
    outer = tl.program_id(0) // tiles_per_outer
    cols = (tl.program_id(0) % tiles_per_outer) * BLOCK_I + tl.arange(0, BLOCK_I)
    col_mask = cols < inner
    base = outer * REDUCED * inner
    if REDUCED <= BLOCK_R:
        # The whole reduced extent in one tile: one read, one write.
        rows = tl.arange(0, BLOCK_R)
        row_mask = rows < REDUCED
        mask = row_mask[:, None] & col_mask[None, :]
        offsets = base + rows[:, None] * inner + cols[None, :]
{tile_loads}
{tile_prologue}
        # Rows past the end hold -inf and drop out; masked columns stay finite and unstored.
        x = tl.where(row_mask[:, None], {logits}, float('-inf'))
        m = tl.max(x, axis=0)
        e = tl.exp(x - m[None, :])
        s = tl.sum(e, axis=0)
        y = {tile_result}
{tile_epilogue}
{tile_stores}
    else:
        # Running column maximum and the sum of exponentials rescaled to it.
        m = tl.full((BLOCK_I,), float('-inf'), tl.float32)
        s = tl.zeros((BLOCK_I,), tl.float32)
        for start in range(0, REDUCED, BLOCK_R):
            rows = start + tl.arange(0, BLOCK_R)
            row_mask = rows < REDUCED
            mask = row_mask[:, None] & col_mask[None, :]
            offsets = base + rows[:, None] * inner + cols[None, :]
{stat_loads}
{stat_prologue}
            x = tl.where(row_mask[:, None], {logits}, float('-inf'))
            m_next = tl.maximum(m, tl.max(x, axis=0))
            s = s * tl.exp(m - m_next) + tl.sum(tl.exp(x - m_next[None, :]), axis=0)
            m = m_next
        for start in range(0, REDUCED, BLOCK_R):
            rows = start + tl.arange(0, BLOCK_R)
            mask = (rows < REDUCED)[:, None] & col_mask[None, :]
            offsets = base + rows[:, None] * inner + cols[None, :]
{loop_loads}
{loop_prologue}
            y = {loop_result}
{loop_epilogue}
{loop_stores}


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, {params}):
        shape = {row_source}.shape
        assert len(shape) == {rank}, "the kernel was written for rank-{rank} inputs"
{contiguity}
        assert {row_source}.numel() < 2**31, "offsets are 32-bit: inputs under 2**31 elements"
        outer = 1
        for size in shape[:{dim}]:
            outer *= size
        inner = 1
        for size in shape[{dim} + 1:]:
            inner *= size
        reduced = shape[{dim}]
{allocs}
        # A short reduced extent leaves room in the tile: the columns widen to fill it.
        block_i = min(triton.next_power_of_2(inner),
                      max({block_i}, {tile} // triton.next_power_of_2(reduced)))
        block_r = min(triton.next_power_of_2(reduced), {tile} // block_i)
        grid = (outer * triton.cdiv(inner, block_i),)
        softmax_kernel[grid](
            {pointer_args},
            inner,
            REDUCED=reduced,
            BLOCK_R=block_r,
            BLOCK_I=block_i,
            num_warps={num_warps},
        )
        return {returns}
'''


def write_dim_softmax(graph: SiteGraph, config: DimSoftmaxConfig) -> str:
    """ModelNew for a site whose one softmax or log_softmax runs over a dimension other than
    the last, with elementwise ops of the input's shape before and after it."""
    for knob in ("block_i", "tile"):
        size = getattr(config, knob)
        if size < 1 or size & (size - 1):
            raise Unsupported(f"{knob} {size}: Triton tiles are powers of two")
    if config.block_i > config.tile:
        raise Unsupported(f"block_i {config.block_i} is wider than a tile of {config.tile}")
    reductions = [i for i, op in enumerate(graph.ops) if op.kind.value == "reduction"]
    if len(reductions) != 1 or graph.ops[reductions[0]].name not in SOFTMAXES:
        raise Unsupported("the dimension softmax kernel takes exactly one softmax or "
                          "log_softmax")
    r = reductions[0]
    anchor = graph.ops[r]
    source_ref = anchor.args[0]
    if not isinstance(source_ref, Ref):
        raise Unsupported(f"the {anchor.name}'s input is not a tensor")
    row = graph.info(source_ref)
    rank = len(row.shape)
    dim = folded_dim(anchor, rank)
    used = full_shape_inputs(graph, row.shape)
    for op in graph.ops:
        if op is not anchor and (op.kind.value != "pointwise" or op.out.shape != row.shape):
            raise Unsupported(f"op {op.name} is not elementwise on the {anchor.name}'s shape")
    if any(ref.is_input or ref.index < r for ref in graph.outputs):
        raise Unsupported(f"the site returns a value computed before the {anchor.name}")
    # The statistics pass needs only the prologue's inputs; the write pass reads every input.
    stat_inputs = sorted({a.index for op in graph.ops[:r] for a in op_refs(op) if a.is_input}
                         | ({source_ref.index} if source_ref.is_input else set()))

    def body(inputs: list[int], depth: int) -> tuple[str, str, dict[Ref, str]]:
        value: dict[Ref, str] = {}
        loads = []
        for index in inputs:
            loads.append(f"x{index} = tl.load(in{index}_ptr + offsets, mask=mask, "
                         "other=0.0).to(tl.float32)")
            value[Ref(index, True)] = f"x{index}"
        prologue = []
        for i, op in enumerate(graph.ops[:r]):
            prologue.append(f"v{i} = {elementwise(op, value)}")
            value[Ref(i, False)] = f"v{i}"
        return indent(loads, depth), indent(prologue, depth), value

    def tail(value: dict[Ref, str], depth: int) -> tuple[str, str]:
        value = {**value, Ref(r, False): "y"}
        epilogue = []
        for i, op in enumerate(graph.ops[r + 1:], r + 1):
            epilogue.append(f"v{i} = {elementwise(op, value)}")
            value[Ref(i, False)] = f"v{i}"
        stores = [f"tl.store(out{k}_ptr + offsets, {value[ref]}.to("
                  f"{tl_dtype(graph.info(ref).dtype)}), mask=mask)"
                  for k, ref in enumerate(graph.outputs)]
        return indent(epilogue, depth), indent(stores, depth)

    tile_loads, tile_prologue, tile_value = body(used, 8)
    stat_loads, stat_prologue, stat_value = body(stat_inputs, 12)
    loop_loads, loop_prologue, loop_value = body(used, 12)
    logits = tile_value[source_ref]
    tile_epilogue, tile_stores = tail(tile_value, 8)
    loop_epilogue, loop_stores = tail(loop_value, 12)
    if anchor.name == "softmax":
        tile_result = "e / s[None, :]"
        loop_result = f"tl.exp({logits} - m[None, :]) / s[None, :]"
    else:
        tile_result = loop_result = f"{logits} - m[None, :] - tl.log(s)[None, :]"
    row_source = f"in{used[0]}"
    outputs = [f"out{k}" for k in range(len(graph.outputs))]
    return with_jit_helpers(_SOURCE.format(
        name=anchor.name, dim=dim, ops=" → ".join(op.name for op in graph.ops),
        config=config.describe(),
        pointer_params=indent([f"in{i}_ptr," for i in used] + [f"{o}_ptr," for o in outputs],
                              4),
        tile_loads=tile_loads, tile_prologue=tile_prologue, logits=logits,
        tile_result=tile_result, tile_epilogue=tile_epilogue, tile_stores=tile_stores,
        stat_loads=stat_loads, stat_prologue=stat_prologue,
        loop_loads=loop_loads, loop_prologue=loop_prologue, loop_result=loop_result,
        loop_epilogue=loop_epilogue, loop_stores=loop_stores,
        params=", ".join(f"in{i}" for i in range(len(graph.inputs))),
        row_source=row_source, rank=rank,
        contiguity=indent([f'assert in{i}.is_contiguous(), "in{i} must be contiguous"'
                           for i in used], 8),
        allocs=indent([f"out{k} = torch.empty(shape, device={row_source}.device, "
                       f"dtype={graph.info(ref).dtype})"
                       for k, ref in enumerate(graph.outputs)], 8),
        block_i=config.block_i, tile=config.tile,
        pointer_args=", ".join([f"in{i}" for i in used] + outputs),
        num_warps=config.num_warps,
        returns=", ".join(outputs),
    ))
