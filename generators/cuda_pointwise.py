"""Tier-2 CUDA for `pointwise` sites: one grid-stride pass over the output, the chain in registers.

Two kernels share the chain. `pointwise_vector` moves VEC consecutive elements per thread with
one 16-byte load or store per tensor (VEC = 16 bytes over the widest element), for calls where
every input is contiguous with the output's shape, 16-byte aligned and the element count is a
multiple of VEC. `pointwise_strided` reads every input through its strides (broadcasts are
stride 0), from coordinates decomposed once per element, so it is right for any layout. The
forward picks one per call from the real tensors.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from generators.codegen import BROADCAST_SHAPE_HELPER, indent, op_refs
from generators.cuda_expressions import (
    HELPERS,
    cuda_elementwise,
    load_as_float,
    storage_type,
    store_from_float,
)
from generators.expressions import channel_aligned_inputs
from generators.site_graph import Ref, SiteGraph, Unsupported

# Raw types for a vector of 1..16 bytes: one load or store instruction each.
_RAW = {1: "unsigned char", 2: "unsigned short", 4: "unsigned int", 8: "uint2", 16: "uint4"}


@dataclass(frozen=True)
class CudaPointwiseConfig:
    threads: int = 256  # per block
    blocks_per_sm: int = 4  # grid = SMs x this, capped by the work; threads loop over the rest
    vector_bytes: int = 16  # bytes per load of the widest tensor on the vector path

    def describe(self) -> str:
        return (f"{self.threads} threads, {self.blocks_per_sm} blocks/SM, "
                f"{self.vector_bytes}-byte vectors")


_SOURCE = '''"""Kiln rules kernel (cuda, pointwise): {ops}. {config}."""

import torch
import torch.nn as nn

from core.cuda_runtime import load_kernel

SOURCE = r"""{helpers}
// Every input contiguous with the output's shape: VEC elements per thread and tensor.
__global__ void pointwise_vector(
{pointer_params}
    long long n_vectors)
{{
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n_vectors;
         i += (long long)gridDim.x * blockDim.x) {{
{vector_loads}
{vector_outs}
#pragma unroll
        for (int j = 0; j < {vec}; ++j) {{
{vector_body}
        }}
{vector_stores}
    }}
}}

// Any layout: each input read through its strides at the element's coordinates.
__global__ void pointwise_strided(
{pointer_params}
    long long n_elements,
{size_params}{stride_params})
{{
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n_elements;
         i += (long long)gridDim.x * blockDim.x) {{
        long long rest = i;
{coordinates}
{strided_loads}
{strided_body}
{strided_stores}
    }}
}}
"""

VEC = {vec}
THREADS = {threads}
BLOCKS_PER_SM = {blocks_per_sm}


{broadcast_helper}

class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.vector = load_kernel(SOURCE, "pointwise_vector", "{vector_types}")
        self.strided = load_kernel(SOURCE, "pointwise_strided", "{strided_types}")

    def forward(self, {params}):
{aligned}        shape = _broadcast_shape([{shapes}])
        assert len(shape) == {rank}, "the kernel was written for rank-{rank} outputs"
{views}
{allocs}
        n = out0.numel()
        if n == 0:
            return {returns}
        sms = torch.cuda.get_device_properties(out0.device).multi_processor_count
        vectorizable = n % VEC == 0 and all(
            x.is_contiguous() and x.shape == shape and x.data_ptr() % 16 == 0
            for x in [{tensors}]
        )
        work = n // VEC if vectorizable else n
        blocks = max(1, min((work + THREADS - 1) // THREADS, sms * BLOCKS_PER_SM))
        if vectorizable:
            self.vector(grid=(blocks, 1, 1), block=(THREADS, 1, 1),
                        args=({pointer_args}, work))
        else:
            self.strided(grid=(blocks, 1, 1), block=(THREADS, 1, 1),
                         args=({pointer_args}, n, {size_args}{stride_args}))
        return {returns}
'''


def used_inputs(graph: SiteGraph) -> list[int]:
    """Indices of the forward arguments the ops read, in order."""
    return sorted({r.index for op in graph.ops for r in op_refs(op) if r.is_input})


def chain(graph: SiteGraph, value: dict[Ref, str]) -> list[str]:
    """`float vI = ...;` for every op, each reading the registers named in `value`."""
    lines = []
    for i, op in enumerate(graph.ops):
        if op.kind.value not in ("pointwise", "view"):
            raise Unsupported(f"{op.name} is not elementwise")
        lines.append(f"const float v{i} = {cuda_elementwise(op, value)};")
        value[Ref(i, False)] = f"v{i}"
    return lines


def write_cuda_pointwise(graph: SiteGraph, config: CudaPointwiseConfig) -> str:
    """The ModelNew source computing `graph` with one CUDA kernel launch."""
    out = graph.info(graph.outputs[0])
    rank = len(out.shape)
    if rank == 0:
        raise Unsupported("a zero-dimensional result is not worth a kernel")
    if any(graph.info(ref).shape != out.shape for ref in graph.outputs):
        raise Unsupported("outputs of different shapes")
    if config.vector_bytes not in (4, 8, 16):
        raise Unsupported(f"vector_bytes {config.vector_bytes}: loads are 4, 8 or 16 bytes")
    used = used_inputs(graph)
    if not used:
        raise Unsupported("the site reads no tensor")
    dtypes = [graph.inputs[i].dtype for i in used] + [graph.info(r).dtype for r in graph.outputs]
    for dtype in dtypes:
        storage_type(dtype)
    widest = max(torch.empty(0, dtype=d).element_size() for d in dtypes)
    vec = config.vector_bytes // widest
    aligned = {r.index for op in graph.ops for r in channel_aligned_inputs(op) if r.is_input}

    def vector_pointer(dtype: torch.dtype) -> tuple[str, str]:
        width = vec * torch.empty(0, dtype=dtype).element_size()
        if width not in _RAW:
            raise Unsupported(f"a {width}-byte vector of {dtype}")
        return _RAW[width], storage_type(dtype)

    vector_loads, vector_outs, vector_stores = [], [], []
    strided_loads, strided_stores = [], []
    vector_value: dict[Ref, str] = {}
    strided_value: dict[Ref, str] = {}
    vector_inputs = []
    for index in used:
        dtype = graph.inputs[index].dtype
        raw, element = vector_pointer(dtype)
        vector_loads += [
            f"const {raw} raw{index} = reinterpret_cast<const {raw}*>(in{index})[i];",
            f"const {element}* e{index} = reinterpret_cast<const {element}*>(&raw{index});",
        ]
        vector_inputs.append(f"const float x{index} = {load_as_float(dtype, f'e{index}[j]')};")
        vector_value[Ref(index, True)] = f"x{index}"
        offset = " + ".join(f"c{d} * in{index}_s{d}" for d in range(rank))
        strided_loads.append(
            f"const float x{index} = {load_as_float(dtype, f'in{index}[{offset}]')};")
        strided_value[Ref(index, True)] = f"x{index}"
    vector_body = vector_inputs + chain(graph, vector_value)
    strided_body = chain(graph, strided_value)
    for k, ref in enumerate(graph.outputs):
        dtype = graph.info(ref).dtype
        raw, element = vector_pointer(dtype)
        vector_outs.append(f"__align__(16) {element} o{k}[{vec}];")
        vector_body.append(f"o{k}[j] = {store_from_float(dtype, vector_value[ref])};")
        vector_stores.append(
            f"reinterpret_cast<{raw}*>(out{k})[i] = *reinterpret_cast<const {raw}*>(o{k});")
        strided_stores.append(f"out{k}[i] = {store_from_float(dtype, strided_value[ref])};")
    coordinates = []
    for d in range(rank - 1, 0, -1):
        coordinates += [f"const long long c{d} = rest % size{d};", f"rest /= size{d};"]
    coordinates.append("const long long c0 = rest;")

    pointer_params = (
        [f"const {storage_type(graph.inputs[i].dtype)}* __restrict__ in{i}," for i in used]
        + [f"{storage_type(graph.info(r).dtype)}* __restrict__ out{k},"
           for k, r in enumerate(graph.outputs)])
    n_pointers = len(pointer_params)
    n_sizes, n_strides = rank - 1, rank * len(used)
    tensors = [f"x{i}" for i in used]
    outs = [f"out{k}" for k in range(len(graph.outputs))]
    return _SOURCE.format(
        broadcast_helper=BROADCAST_SHAPE_HELPER,
        ops=" → ".join(op.name for op in graph.ops),
        config=config.describe(),
        helpers=HELPERS,
        pointer_params=indent(pointer_params, 4),
        vector_loads=indent(vector_loads, 8),
        vector_outs=indent(vector_outs, 8),
        vec=vec,
        vector_body=indent(vector_body, 12),
        vector_stores=indent(vector_stores, 8),
        size_params="".join(f"    long long size{d},\n" for d in range(1, rank)),
        stride_params=",\n".join(f"    long long in{i}_s{d}" for i in used for d in range(rank)),
        coordinates=indent(coordinates, 8),
        strided_loads=indent(strided_loads, 8),
        strided_body=indent(strided_body, 8),
        strided_stores=indent(strided_stores, 8),
        threads=config.threads,
        blocks_per_sm=config.blocks_per_sm,
        vector_types="P" * n_pointers + "q",
        strided_types="P" * n_pointers + "q" * (1 + n_sizes + n_strides),
        params=", ".join(f"in{i}" for i in range(len(graph.inputs))),
        aligned="".join(f"        x{i} = in{i}.reshape([1, -1] + [1] * ({rank} - 2))\n"
                        for i in sorted(aligned)),
        shapes=", ".join(f"x{i}.shape" if i in aligned else f"in{i}.shape" for i in used),
        rank=rank,
        views=indent([f"x{i} = {'x' if i in aligned else 'in'}{i}.expand(shape)"
                       for i in used], 8),
        allocs=indent([f"out{k} = torch.empty(shape, device=in{used[0]}.device, "
                        f"dtype={graph.info(r).dtype})" for k, r in enumerate(graph.outputs)], 8),
        tensors=", ".join(tensors),
        pointer_args=", ".join(tensors + outs),
        size_args="".join(f"shape[{d}], " for d in range(1, rank)),
        stride_args="".join(f"*x{i}.stride(), " for i in used),
        returns=", ".join(outs),
    )
