"""Tier-1 Triton for sum, mean, amax and amin over a dimension that is not the last.

The input is viewed as [outer, reduced, inner]: each program owns one outer index and BLOCK_I
consecutive inner columns, walks its share of the reduced dimension BLOCK_R rows at a time with
every load coalesced along the inner columns, and applies the site's elementwise prologue (on
the input's shape) in registers. With one program per column tile (split 1) the same program
applies the epilogue and writes the result: one read, one write. A tile with few programs
behind it (a reduction of all the rows of a wide matrix has one outer index) is split: `split`
programs each fold a slice of the reduced rows into an fp32 partial, and a small second kernel
folds the partials in a fixed order (reproducible, no atomics) and applies the epilogue.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from core.profile.roofline import GpuPeaks
from generators.codegen import SM_COUNT_LINE, indent, op_refs
from generators.site_graph import Op, Ref, SiteGraph, Unsupported
from generators.triton.expressions import elementwise, tl_dtype, with_jit_helpers

FOLDS = {"sum": ("tl.sum", "0.0", "+"), "mean": ("tl.sum", "0.0", "+"),
         "amax": ("tl.max", "float('-inf')", "max"), "amin": ("tl.min", "float('inf')", "min")}
AUTO_SPLIT = 0  # `split` value meaning: chosen at run time from the shape and the SM count
H200_SMS = GpuPeaks().sms  # what rationales assume when no GPU is at hand to ask


@dataclass(frozen=True)
class DimConfig:
    block_r: int = 16
    block_i: int = 128
    num_warps: int = 4
    split: int = 1  # programs sharing one column tile's reduced rows; AUTO_SPLIT: from the shape
    programs_per_sm: int = 4  # the grid an automatic split aims for

    def describe(self) -> str:
        tiles = (f"{self.block_r}×{self.block_i} tiles over (reduced, inner), "
                 f"{self.num_warps} warps")
        if self.split == AUTO_SPLIT:
            return f"{tiles}, reduced rows split for about {self.programs_per_sm} programs per SM"
        if self.split == 1:
            return f"{tiles}, one program per column tile"
        return f"{tiles}, reduced rows split {self.split} ways"


_FINISH = '''

@triton.jit
def finish(acc, REDUCED: tl.constexpr):
    """The reduced value{scale_doc}, then the site's epilogue."""
    y = acc{scale}
{epilogue}
    return {result}
'''

_SOURCE = '''"""Kiln rules kernel (triton, reduction over dim {dim}): {ops}. {config}."""

import torch
import torch.nn as nn
import triton
import triton.language as tl
{finish}

@triton.jit
def dim_kernel(
{pointer_params}
{split_params}    inner,
    REDUCED: tl.constexpr,
    CHUNK: tl.constexpr,
{split_constexpr}    BLOCK_R: tl.constexpr,
    BLOCK_I: tl.constexpr,
):
    # One flat grid axis over (outer, column tile): either count may pass 65535.
    tiles_per_outer = tl.cdiv(inner, BLOCK_I)
    outer = tl.program_id(0) // tiles_per_outer
    cols = (tl.program_id(0) % tiles_per_outer) * BLOCK_I + tl.arange(0, BLOCK_I)
    col_mask = cols < inner
{part}    # Each lane folds its own rows; the rows are folded across lanes once, after the loop (a
    # fold per step put three barriers in every iteration).
    acc = tl.full((BLOCK_R, BLOCK_I), {neutral}, tl.float32)
    for start in range(0, CHUNK, BLOCK_R):
        rows = {first_row}start + tl.arange(0, BLOCK_R)
        mask = (rows < REDUCED)[:, None] & col_mask[None, :]
        offsets = outer * REDUCED * inner + rows[:, None] * inner + cols[None, :]
{loads}
{prologue}
        tile = tl.where(mask, {reduced_value}, {neutral})
        acc = {combine_tile}
    folded = {fold}(acc, axis=0)
{write}
{combine_kernel}

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
        out_shape = {out_shape}
{allocs}
        tiles = outer * triton.cdiv(inner, {block_i})
{split}
{launch}
        return out0
'''

_ONE_PASS_WRITE = (
    "    tl.store(out0_ptr + outer * inner + cols, finish(folded, REDUCED).to({out_dtype}),\n"
    "             mask=col_mask)")

_SPLIT_WRITE = '''    if SPLIT == 1:
        tl.store(out0_ptr + outer * inner + cols, finish(folded, REDUCED).to({out_dtype}),
                 mask=col_mask)
    else:
        # Partials laid out [SPLIT, outer, inner]: the combine kernel reads them coalesced.
        tl.store(partial_ptr + (part * outer_count + outer) * inner + cols, folded,
                 mask=col_mask)'''

_COMBINE_KERNEL = '''

@triton.jit
def combine_kernel(
    partial_ptr,
    out0_ptr,
    outer_count,
    inner,
    REDUCED: tl.constexpr,
    SPLIT: tl.constexpr,
    BLOCK_I: tl.constexpr,
):
    """Fold the SPLIT partials of each output in order: the same result on every run."""
    tiles_per_outer = tl.cdiv(inner, BLOCK_I)
    outer = tl.program_id(0) // tiles_per_outer
    cols = (tl.program_id(0) % tiles_per_outer) * BLOCK_I + tl.arange(0, BLOCK_I)
    col_mask = cols < inner
    acc = tl.load(partial_ptr + outer * inner + cols, mask=col_mask, other=0.0)
    for part in range(1, SPLIT):
        partial = tl.load(partial_ptr + (part * outer_count + outer) * inner + cols,
                          mask=col_mask, other=0.0)
        acc = {combine_partial}
    tl.store(out0_ptr + outer * inner + cols, finish(acc, REDUCED).to({out_dtype}),
             mask=col_mask)
'''

_CHUNKS = '''# Each program folds CHUNK rows (whole BLOCK_R steps); no program is left empty.
chunk = triton.cdiv(triton.cdiv(reduced, split), {block_r}) * {block_r}
split = triton.cdiv(reduced, chunk) if reduced else 1'''
_FIXED_SPLIT = '''split = max(1, min({split}, triton.cdiv(reduced, {block_r})))
''' + _CHUNKS
_ONE_PASS_CHUNK = "chunk = triton.cdiv(reduced, {block_r}) * {block_r}"

_AUTO_SPLIT = "device = {row_source}.device\n" + SM_COUNT_LINE + '''
# Enough programs sharing each column tile for about {programs_per_sm} per SM, at most one per
# BLOCK_R rows.
wanted = triton.cdiv({programs_per_sm} * sms, max(tiles, 1))
split = max(1, min(triton.cdiv(reduced, {block_r}), wanted))
''' + _CHUNKS

_LAUNCH = '''dim_kernel[{grid}](
    {pointer_args},
{split_args}
    inner,
    REDUCED=reduced,
    CHUNK=chunk,
{split_kwargs}
    BLOCK_R={block_r},
    BLOCK_I={block_i},
    num_warps={num_warps},
)'''

_COMBINE_LAUNCH = '''if split > 1:
    combine_kernel[(tiles,)](
        partial, out0, outer, inner,
        REDUCED=reduced,
        SPLIT=split,
        BLOCK_I={block_i},
        num_warps={num_warps},
    )'''


def split_for(shape: tuple[int, ...], dim: int, config: DimConfig, sms: int = H200_SMS) -> int:
    """How many programs share each column tile's reduced rows: what the generated source
    computes at run time for `config` on an input of `shape` reduced over `dim`."""
    reduced = shape[dim]
    if reduced == 0:
        return 1
    steps = _cdiv(reduced, config.block_r)
    if config.split == AUTO_SPLIT:
        tiles = math.prod(shape[:dim]) * _cdiv(math.prod(shape[dim + 1:]), config.block_i)
        split = max(1, min(steps, _cdiv(config.programs_per_sm * sms, max(tiles, 1))))
    else:
        split = max(1, min(config.split, steps))
    chunk = _cdiv(_cdiv(reduced, split), config.block_r) * config.block_r
    return _cdiv(reduced, chunk)


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def folded_dim(anchor: Op, rank: int) -> int:
    """The one dimension `anchor` reduces, in [0, rank - 1); the last belongs to row kernels."""
    dim = anchor.kwarg("dim", anchor.args[1] if len(anchor.args) > 1 else None)
    if isinstance(dim, tuple) and len(dim) == 1:
        dim = dim[0]
    if not isinstance(dim, int) or rank == 0:
        raise Unsupported(f"{anchor.name} over {dim!r}: the kernel folds one dimension")
    dim %= rank
    if dim == rank - 1:
        raise Unsupported("a last-dimension reduction belongs to the row kernel")
    return dim


def full_shape_inputs(graph: SiteGraph, shape: tuple[int, ...]) -> list[int]:
    """The inputs the site reads; each must be a float tensor of the reduced input's shape."""
    used = sorted({a.index for op in graph.ops for a in op_refs(op) if a.is_input})
    for index in used:
        info = graph.inputs[index]
        if info.shape != shape or not info.dtype.is_floating_point:
            raise Unsupported(f"input in{index} is not a float tensor of the reduced input's "
                              "shape")
    return used


def write_dim_reduction(graph: SiteGraph, config: DimConfig) -> str:
    """ModelNew for a site whose one reduction folds a dimension other than the last."""
    anchors = [i for i, op in enumerate(graph.ops) if op.name in FOLDS]
    if len(anchors) != 1 or len([o for o in graph.ops if o.kind.value == "reduction"]) != 1:
        raise Unsupported("the dimension kernel takes exactly one sum, mean, amax or amin")
    if config.split < 0:
        raise Unsupported(f"split {config.split}: a count of programs, or {AUTO_SPLIT} for auto")
    r = anchors[0]
    anchor = graph.ops[r]
    source_ref = anchor.args[0]
    if not isinstance(source_ref, Ref):
        raise Unsupported("the reduction's input is not a tensor")
    row = graph.info(source_ref)
    rank = len(row.shape)
    dim = folded_dim(anchor, rank)
    if anchor.kwarg("dtype") is not None:
        raise Unsupported("a reduction with its own accumulation dtype")
    keepdim = bool(anchor.kwarg("keepdim", anchor.args[2] if len(anchor.args) > 2 else False))
    used = full_shape_inputs(graph, row.shape)
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
        # Each value is read once: evict-first keeps L2 for the partials (a small gain on sum
        # over dim 1 of 64×2048×512 fp32 on an H200: bench/NOTES.md, fifth round).
        loads.append(f"x{index} = tl.load(in{index}_ptr + offsets, mask=mask, other=0.0, "
                     "eviction_policy='evict_first').to(tl.float32)")
        value[Ref(index, True)] = f"x{index}"
    prologue = []
    for i, op in enumerate(graph.ops[:r]):
        prologue.append(f"v{i} = {elementwise(op, value)}")
        value[Ref(i, False)] = f"v{i}"
    fold, neutral, join = FOLDS[anchor.name]
    reduced_value = value[source_ref]
    value[Ref(r, False)] = "y"
    epilogue = []
    for i, op in enumerate(graph.ops[r + 1:], r + 1):
        epilogue.append(f"v{i} = {elementwise(op, value)}")
        value[Ref(i, False)] = f"v{i}"
    result = graph.outputs[0]
    out_dtype = tl_dtype(graph.info(result).dtype)
    row_source = f"in{used[0]}"
    splits = config.split != 1
    pointers = [f"in{i}" for i in used] + ["out0"] + (["partial"] if splits else [])
    allocs = [f"out0 = torch.empty(out_shape, device={row_source}.device, "
              f"dtype={graph.info(result).dtype})"]
    if config.split == AUTO_SPLIT:
        split = _AUTO_SPLIT.format(row_source=row_source, block_r=config.block_r,
                                   programs_per_sm=config.programs_per_sm)
    elif splits:
        split = _FIXED_SPLIT.format(split=config.split, block_r=config.block_r)
    else:
        split = _ONE_PASS_CHUNK.format(block_r=config.block_r)
    launch = _LAUNCH.format(
        grid="(tiles, split)" if splits else "(tiles,)", pointer_args=", ".join(pointers),
        split_args="    outer," if splits else "",
        split_kwargs="    SPLIT=split," if splits else "",
        block_r=config.block_r, block_i=config.block_i, num_warps=config.num_warps)
    launch = "\n".join(line for line in launch.splitlines() if line)
    if splits:
        launch = "\n".join([
            "# One fp32 partial result per share of the reduced rows.",
            "partial = torch.empty((split, outer, inner), device=out0.device, "
            "dtype=torch.float32)",
            launch,
            _COMBINE_LAUNCH.format(block_i=config.block_i, num_warps=config.num_warps)])
    return with_jit_helpers(_SOURCE.format(
        dim=dim, ops=" → ".join(op.name for op in graph.ops), config=config.describe(),
        finish=_FINISH.format(scale=" / REDUCED" if anchor.name == "mean" else "",
                              scale_doc=" (the sum over REDUCED rows for a mean)"
                              if anchor.name == "mean" else "",
                              epilogue=indent(epilogue, 4), result=value[result]),
        pointer_params=indent([f"{p}_ptr," for p in pointers], 4),
        split_params="    outer_count,\n" if splits else "",
        split_constexpr="    SPLIT: tl.constexpr,\n" if splits else "",
        part=("    part = tl.program_id(1)  # which CHUNK of the reduced rows this program folds\n"
              if splits else ""),
        first_row="part * CHUNK + " if splits else "",
        neutral=neutral, loads=indent(loads, 8), prologue=indent(prologue, 8),
        reduced_value=reduced_value, combine_tile=_join(join, "acc", "tile"), fold=fold,
        write=(_SPLIT_WRITE if splits else _ONE_PASS_WRITE).format(out_dtype=out_dtype),
        combine_kernel=_COMBINE_KERNEL.format(
            combine_partial=_join(join, "acc", "partial"), out_dtype=out_dtype)
        if splits else "",
        params=", ".join(f"in{i}" for i in range(len(graph.inputs))),
        row_source=row_source, rank=rank,
        contiguity=indent([f'assert in{i}.is_contiguous(), "in{i} must be contiguous"'
                           for i in used], 8),
        out_shape=(f"shape[:{dim}] + (1,) + shape[{dim} + 1:]" if keepdim
                   else f"shape[:{dim}] + shape[{dim} + 1:]"),
        allocs=indent(allocs, 8),
        block_i=config.block_i, block_r=config.block_r,
        split=indent(split.splitlines(), 8),
        launch=indent(launch.splitlines(), 8),
    ))


def _join(join: str, left: str, right: str) -> str:
    if join == "+":
        return f"{left} + {right}"
    return f"tl.{'maximum' if join == 'max' else 'minimum'}({left}, {right})"
