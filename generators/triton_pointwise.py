"""Tier-1 Triton for `pointwise` sites: one pass over the output, the whole chain in registers.

Each program handles BLOCK consecutive output elements. An input laid out like the output is
read at the same linear offset; any other (broadcast, strided, channel-aligned for batch
norm) is read through its strides, from coordinates decomposed once per element. Which inputs
are linear is decided per call from their real layouts (a constexpr, so Triton compiles the
variants it needs), so the kernel is right for every shape and stride, not just the captured.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from generators.codegen import BROADCAST_SHAPE_HELPER, indent, op_refs
from generators.expressions import channel_aligned_inputs, elementwise, tl_dtype
from generators.site_graph import Ref, SiteGraph, Unsupported


@dataclass(frozen=True)
class PointwiseConfig:
    block: int = 1024
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
    n_elements,
{size_params}
{stride_params}
{linear_params}
    BLOCK: tl.constexpr,
):
    offsets = tl.program_id(0){widen} * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n_elements
{coordinates}
{loads}
{body}
{stores}


{broadcast_helper}

class {class_name}(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, {params}):
{aligned}
        shape = _broadcast_shape([{shapes}])
        rank = len(shape)
        assert rank == {rank}, "the kernel was written for rank-{rank} outputs"
{views}
{allocs}
        n_elements = {first_out}.numel()
        grid = (triton.cdiv(n_elements, {block}),)
        pointwise_kernel[grid](
            {pointer_args},
            n_elements,
            {size_args}
            {stride_args}
            {linear_args}
            BLOCK={block},
            num_warps={num_warps},
        )
        return {returns}
'''


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
    for index in used:
        dtype = graph.inputs[index].dtype
        if not (dtype.is_floating_point or dtype == torch.bool):
            raise Unsupported(f"input in{index} is {dtype}: the rules handle float and bool")
    aligned = {r.index for op in graph.ops for r in channel_aligned_inputs(op) if r.is_input}

    value: dict[Ref, str] = {}
    loads, body = [], []
    for index in used:
        info = graph.inputs[index]
        ref = Ref(index, True)
        pointer = f"in{index}_ptr"
        strided = " + ".join(f"c{d} * in{index}_s{d}" for d in range(rank))
        convert = ".to(tl.float32)" if info.dtype.is_floating_point else ""
        loads += [
            f"if LINEAR_{index}:",
            f"    x{index} = tl.load({pointer} + offsets, mask=mask){convert}",
            "else:",
            f"    x{index} = tl.load({pointer} + {strided}, mask=mask){convert}",
        ]
        value[ref] = f"x{index}"
    for i, op in enumerate(graph.ops):
        if op.kind.value not in ("pointwise", "view"):
            raise Unsupported(f"{op.name} is not elementwise")
        body.append(f"v{i} = {elementwise(op, value)}")
        value[Ref(i, False)] = f"v{i}"
    stores = []
    for k, ref in enumerate(graph.outputs):
        dtype = graph.info(ref).dtype
        stores.append(f"tl.store(out{k}_ptr + offsets, {value[ref]}.to({tl_dtype(dtype)}), "
                      "mask=mask)")
    coordinates = ["rest = offsets"]
    for d in range(rank - 1, 0, -1):
        coordinates += [f"c{d} = rest % size{d}", f"rest = rest // size{d}"]
    coordinates.append("c0 = rest")

    pointer_params = [f"in{i}_ptr," for i in used] + [f"out{k}_ptr,"
                                                      for k in range(len(graph.outputs))]
    params = ", ".join(f"in{i}" for i in range(len(graph.inputs)))
    shapes = ", ".join(f"x{i}.shape" if i in aligned else f"in{i}.shape" for i in used)
    views = [f"x{i} = {'x' if i in aligned else 'in'}{i}.expand(shape)" for i in used]
    aligned_views = [f"x{i} = in{i}.reshape([1, -1] + [1] * ({rank} - 2))" for i in sorted(aligned)]
    allocs = [
        f"out{k} = torch.empty(shape, device=in{used[0]}.device, "
        f"dtype={graph.info(ref).dtype})" for k, ref in enumerate(graph.outputs)
    ]
    wide = out.numel >= 2**31
    ops = " → ".join(op.name for op in graph.ops)
    return _SOURCE.format(
        broadcast_helper=BROADCAST_SHAPE_HELPER,
        title=title or f"Kiln rules kernel (triton, pointwise): {ops}. {config.describe()}.",
        class_name=class_name,
        pointer_params=indent(pointer_params, 4),
        size_params=indent([f"size{d}," for d in range(1, rank)], 4),
        stride_params=indent([f"in{i}_s{d}," for i in used for d in range(rank)], 4),
        linear_params=indent([f"LINEAR_{i}: tl.constexpr," for i in used], 4),
        widen=".to(tl.int64)" if wide else "",
        coordinates=indent(coordinates, 4),
        loads=indent(loads, 4),
        body=indent(body, 4),
        stores=indent(stores, 4),
        params=params,
        aligned=indent(aligned_views, 8),
        shapes=shapes,
        rank=rank,
        views=indent(views, 8),
        allocs=indent(allocs, 8),
        first_out="out0",
        block=config.block,
        pointer_args=", ".join([f"x{i}" for i in used]
                               + [f"out{k}" for k in range(len(graph.outputs))]),
        size_args="".join(f"shape[{d}], " for d in range(1, rank)),
        stride_args="".join(f"*x{i}.stride(), " for i in used),
        linear_args="".join(f"LINEAR_{i}=x{i}.is_contiguous() and x{i}.shape == shape, "
                            for i in used),
        num_warps=config.num_warps,
        returns=", ".join(f"out{k}" for k in range(len(graph.outputs))),
    )
