"""Tier-1 Triton for `reduction` sites over the last dimension: one program per row.

The row is loaded once, the site's elementwise prologue applied in registers, then the
reduction (softmax, log_softmax, layer_norm, rms_norm, sum, mean, amax, amin), then the
epilogue, then one store: a single pass over memory. Inputs of the row's shape (or broadcast
to it: weights, biases, per-row scalars) are read through their strides from the row's
leading coordinates, so any layout works. Rows up to MAX_ROW elements fit in registers.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from generators.codegen import indent, op_refs
from generators.expressions import elementwise, tl_dtype
from generators.site_graph import Op, Ref, SiteGraph, Unsupported

MAX_ROW = 32768
NORMALIZING = ("softmax", "log_softmax", "layer_norm", "rms_norm")
REDUCING = ("sum", "mean", "amax", "amin")


@dataclass(frozen=True)
class RowConfig:
    num_warps: int = 4

    def describe(self) -> str:
        return f"one row per program, {self.num_warps} warps"


_SOURCE = '''"""Kiln rules kernel (triton, reduction): {ops}. {config}."""

import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def row_kernel(
{pointer_params}
    n_cols,
{size_params}
{stride_params}
    BLOCK_N: tl.constexpr,
):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK_N)
    mask = cols < n_cols
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
        n_cols = shape[-1]
        assert n_cols <= {max_row}, "rows longer than {max_row} need a looped kernel"
{views}
{allocs}
        n_rows = {row_source}.numel() // max(n_cols, 1)
        row_kernel[(n_rows,)](
            {pointer_args},
            n_cols,
            {size_args}
            {stride_args}
            BLOCK_N=triton.next_power_of_2(n_cols),
            num_warps={num_warps},
        )
        return {returns}
'''


def _dim(op: Op) -> object:
    dim = op.kwarg("dim", op.args[1] if len(op.args) > 1 else None)
    return dim[0] if isinstance(dim, tuple) and len(dim) == 1 else dim


def _reduction_body(op: Op, x: str, value: dict[Ref, str], n: str) -> list[str]:
    """Statements computing `y` from the prologue's row `x` (masked lanes already neutral)."""
    name = op.name
    if name in ("softmax", "log_softmax"):
        lines = [f"m = tl.max(tl.where(mask, {x}, float('-inf')), axis=0)",
                 f"e = tl.where(mask, tl.exp({x} - m), 0.0)",
                 "s = tl.sum(e, axis=0)"]
        lines.append("y = e / s" if name == "softmax" else f"y = {x} - m - tl.log(s)")
        return lines
    if name in ("layer_norm", "rms_norm"):
        shape = op.args[1] if len(op.args) > 1 else op.kwarg("normalized_shape")
        if not isinstance(shape, tuple) or len(shape) != 1:
            raise Unsupported("normalization over more than the last dimension")
        weight = op.args[2] if len(op.args) > 2 else op.kwarg("weight")
        if name == "layer_norm":
            bias = op.args[3] if len(op.args) > 3 else op.kwarg("bias")
            eps = op.args[4] if len(op.args) > 4 else op.kwarg("eps", 1e-5)
            lines = [f"mean = tl.sum(tl.where(mask, {x}, 0.0), axis=0) / {n}",
                     f"centered = tl.where(mask, {x} - mean, 0.0)",
                     f"var = tl.sum(centered * centered, axis=0) / {n}",
                     f"y = centered * tl.rsqrt(var + {float(eps)!r})"]
        else:
            bias = None
            eps = op.args[3] if len(op.args) > 3 else op.kwarg("eps")
            if eps is None:
                eps = torch.finfo(op.out.dtype).eps
            lines = [f"ms = tl.sum(tl.where(mask, {x} * {x}, 0.0), axis=0) / {n}",
                     f"y = {x} * tl.rsqrt(ms + {float(eps)!r})"]
        if isinstance(weight, Ref):
            lines.append(f"y = y * {value[weight]}")
        if isinstance(bias, Ref):
            lines.append(f"y = y + {value[bias]}")
        return lines
    if name in REDUCING:
        neutral = {"sum": "0.0", "mean": "0.0", "amax": "float('-inf')",
                   "amin": "float('inf')"}[name]
        fold = {"sum": "tl.sum", "mean": "tl.sum", "amax": "tl.max", "amin": "tl.min"}[name]
        lines = [f"y = {fold}(tl.where(mask, {x}, {neutral}), axis=0)"]
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

    value: dict[Ref, str] = {}
    loads = []
    for index in used:
        base = " + ".join(f"c{d} * in{index}_s{d}" for d in range(rank - 1)) or "0"
        loads.append(f"x{index} = tl.load(in{index}_ptr + {base} + cols * in{index}_s{rank - 1}, "
                     "mask=mask, other=0.0).to(tl.float32)")
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
        target = f"out{k}_ptr + row" if shrunk else f"out{k}_ptr + row * n_cols + cols"
        masked = "" if shrunk else ", mask=mask"
        stores.append(f"tl.store({target}, {value[ref]}.to({tl_dtype(info.dtype)}){masked})")
        out_shape = "shape[:-1] + (1,)" if shrunk and _keepdim(anchor) else (
            "shape[:-1]" if shrunk else "shape")
        allocs.append(f"out{k} = torch.empty({out_shape}, device={row_source}.device, "
                      f"dtype={info.dtype})")
    coordinates = ["rest = row"]
    for d in range(rank - 2, 0, -1):
        coordinates += [f"c{d} = rest % size{d}", f"rest = rest // size{d}"]
    if rank > 1:
        coordinates.append("c0 = rest")
    return _SOURCE.format(
        ops=" → ".join(op.name for op in graph.ops),
        config=config.describe(),
        pointer_params=indent([f"in{i}_ptr," for i in used]
                               + [f"out{k}_ptr," for k in range(len(graph.outputs))], 4),
        size_params=indent([f"size{d}," for d in range(1, rank - 1)], 4),
        stride_params=indent([f"in{i}_s{d}," for i in used for d in range(rank)], 4),
        coordinates=indent(coordinates, 4),
        loads=indent(loads, 4),
        prologue=indent(prologue, 4),
        reduction=indent(reduction, 4),
        epilogue=indent(epilogue, 4),
        stores=indent(stores, 4),
        params=", ".join(f"in{i}" for i in range(len(graph.inputs))),
        row_source=row_source,
        rank=rank,
        max_row=MAX_ROW,
        views=indent([f"x{i} = in{i}.expand(shape)" for i in used], 8),
        allocs=indent(allocs, 8),
        pointer_args=", ".join([f"x{i}" for i in used]
                               + [f"out{k}" for k in range(len(graph.outputs))]),
        size_args="".join(f"shape[{d}], " for d in range(1, rank - 1)),
        stride_args="".join(f"*x{i}.stride(), " for i in used),
        num_warps=config.num_warps,
        returns=", ".join(f"out{k}" for k in range(len(graph.outputs))),
    )


def _keepdim(op: Op) -> bool:
    return bool(op.kwarg("keepdim", op.args[2] if len(op.args) > 2 else False))
