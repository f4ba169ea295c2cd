"""Tier-2 CUDA for `pointwise` sites: one grid-stride pass over the output, the chain in registers.

Two kernels share the chain. `pointwise_vector` moves VEC consecutive elements per thread with
one 16-byte load or store per tensor (VEC = 16 bytes over the widest element), for calls where
every input is contiguous with the output's shape, 16-byte aligned and the element count is a
multiple of VEC. `pointwise_rows` takes every other layout: the forward views the output as
rows × columns (adjacent dims every tensor walks as one merged, the innermost merged dim the
columns), and each thread decomposes its row's coordinates once per tile, in 32 bits when they
fit and skipping size-1 dims, then reads every tensor along the row with one stride, up to 8
columns per tile. A bias (N,) over (M, N) costs no division at all; a per-channel vector over
(B, C, H, W) one per thread and tile. The forward picks one kernel per call from the real
tensors.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from generators.codegen import BROADCAST_SHAPE_HELPER, ROWS_AND_COLUMNS_HELPER, indent, op_refs
from generators.cuda.expressions import (
    HELPERS,
    cuda_elementwise,
    load_as_float,
    storage_type,
    store_from_float,
)
from generators.op_table import channel_aligned_inputs
from generators.site_graph import Ref, SiteGraph, Unsupported

# Raw types for a vector of 1..16 bytes: one load or store instruction each.
RAW_VECTOR_TYPES = {1: "unsigned char", 2: "unsigned short", 4: "unsigned int", 8: "uint2",
                    16: "uint4"}


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

from core.runtime.cuda import load_kernel

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

// The next coordinate of a row index, innermost first: 32-bit division when the values fit
// (a 64-bit one costs several times more), none for a size-1 dim.
__device__ __forceinline__ long long next_coordinate(long long& rest, long long size)
{{
    if (size == 1) {{
        return 0;
    }}
    if ((((unsigned long long)rest | (unsigned long long)size) >> 32) == 0) {{
        const unsigned int quotient = (unsigned int)rest / (unsigned int)size;
        const long long coordinate = rest - (long long)quotient * size;
        rest = quotient;
        return coordinate;
    }}
    const long long quotient = rest / size;
    const long long coordinate = rest - quotient * size;
    rest = quotient;
    return coordinate;
}}

// Any layout, as rows × columns: a block's threads form (blockDim.x >> col_shift) rows ×
// (1 << col_shift) columns; each thread finds its row's offsets (and the values of inputs
// constant along the row) once per tile, then walks up to `steps` columns (1 << col_shift)
// apart. Tiles are dealt grid-stride with no division.
__global__ void pointwise_rows(
{pointer_params}
    long long n_rows,
    long long n_cols,
    int col_shift,
    int steps,
{size_params}{stride_params})
{{
    const int tile_cols = 1 << col_shift;
    const int tile_rows = blockDim.x >> col_shift;
    const long long span = (long long)tile_cols * steps;
    const long long col_tiles = (n_cols + span - 1) / span;
    const long long row_tiles = (n_rows + tile_rows - 1) / tile_rows;
    const long long row_step = gridDim.x / col_tiles;
    const long long col_step = gridDim.x % col_tiles;
    long long row_tile = blockIdx.x / col_tiles;
    long long col_tile = blockIdx.x % col_tiles;
    const int ty = threadIdx.x >> col_shift;
    const int tx = threadIdx.x & (tile_cols - 1);
    while (row_tile < row_tiles) {{
        const long long row = row_tile * tile_rows + ty;
        if (row < n_rows) {{
            long long rest = row;
{coordinates}
{row_offsets}
            const long long end = (col_tile + 1) * span < n_cols ? (col_tile + 1) * span : n_cols;
            for (long long col = col_tile * span + tx; col < end; col += tile_cols) {{
{rows_loads}
{rows_body}
{rows_stores}
            }}
        }}
        row_tile += row_step;
        col_tile += col_step;
        if (col_tile >= col_tiles) {{
            col_tile -= col_tiles;
            ++row_tile;
        }}
    }}
}}
"""

VEC = {vec}
THREADS = {threads}
BLOCKS_PER_SM = {blocks_per_sm}


{broadcast_helper}

{rows_helper}

def _row_tiles(n_rows, n_cols):
    """log2 of a tile's columns (a power of two up to THREADS), columns per thread and tile
    (up to 8), and the number of tiles."""
    col_shift = min(THREADS, 1 << (n_cols - 1).bit_length()).bit_length() - 1
    steps = min(8, -(-n_cols // (1 << col_shift)))
    tiles = -(-n_rows // (THREADS >> col_shift)) * -(-n_cols // ((1 << col_shift) * steps))
    return col_shift, steps, tiles


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.vector = load_kernel(SOURCE, "pointwise_vector", "{vector_types}")
        self.rows = load_kernel(SOURCE, "pointwise_rows", "{rows_types}")

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
        if vectorizable:
            blocks = max(1, min((n // VEC + THREADS - 1) // THREADS, sms * BLOCKS_PER_SM))
            self.vector(grid=(blocks, 1, 1), block=(THREADS, 1, 1),
                        args=({pointer_args}, n // VEC))
        else:
            sizes, n_cols, strides, _ = _rows_and_columns(shape, [{strides}], {row_dims})
            col_shift, steps, tiles = _row_tiles(n // n_cols, n_cols)
            blocks = max(1, min(tiles, sms * BLOCKS_PER_SM))
            self.rows(grid=(blocks, 1, 1), block=(THREADS, 1, 1),
                      args=({pointer_args}, n // n_cols, n_cols, col_shift, steps, *sizes,
                            {stride_args}))
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
    if config.threads & (config.threads - 1):
        raise Unsupported(f"{config.threads} threads: row tiles need a power of two")
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
        if width not in RAW_VECTOR_TYPES:
            raise Unsupported(f"a {width}-byte vector of {dtype}")
        return RAW_VECTOR_TYPES[width], storage_type(dtype)

    vector_loads, vector_outs, vector_stores = [], [], []
    row_offsets, rows_loads, rows_stores = [], [], []
    vector_value: dict[Ref, str] = {}
    rows_value: dict[Ref, str] = {}
    row_dims = max(rank - 1, 1)
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
        # An input constant along the row (a per-channel parameter) is loaded once per row.
        row_offsets += [
            f"const long long in{index}_row = "
            + " + ".join(f"r{d} * in{index}_r{d}" for d in range(row_dims)) + ";",
            f"const float in{index}_once = in{index}_c == 0 ? "
            f"{load_as_float(dtype, f'in{index}[in{index}_row]')} : 0.0f;",
        ]
        element_at = f"in{index}[in{index}_row + col * in{index}_c]"
        rows_loads.append(f"const float x{index} = in{index}_c == 0 ? in{index}_once : "
                          f"{load_as_float(dtype, element_at)};")
        rows_value[Ref(index, True)] = f"x{index}"
    vector_body = vector_inputs + chain(graph, vector_value)
    rows_body = chain(graph, rows_value)
    for k, ref in enumerate(graph.outputs):
        dtype = graph.info(ref).dtype
        raw, element = vector_pointer(dtype)
        vector_outs.append(f"__align__(16) {element} o{k}[{vec}];")
        vector_body.append(f"o{k}[j] = {store_from_float(dtype, vector_value[ref])};")
        vector_stores.append(
            f"reinterpret_cast<{raw}*>(out{k})[i] = *reinterpret_cast<const {raw}*>(o{k});")
        rows_stores.append(
            f"out{k}[row * n_cols + col] = {store_from_float(dtype, rows_value[ref])};")
    coordinates = [f"const long long r{d} = next_coordinate(rest, size{d});"
                   for d in range(row_dims - 1, 0, -1)] + ["const long long r0 = rest;"]

    pointer_params = (
        [f"const {storage_type(graph.inputs[i].dtype)}* __restrict__ in{i}," for i in used]
        + [f"{storage_type(graph.info(r).dtype)}* __restrict__ out{k},"
           for k, r in enumerate(graph.outputs)])
    n_pointers = len(pointer_params)
    n_sizes, n_strides = row_dims, (row_dims + 1) * len(used)
    tensors = [f"x{i}" for i in used]
    outs = [f"out{k}" for k in range(len(graph.outputs))]
    return _SOURCE.format(
        broadcast_helper=BROADCAST_SHAPE_HELPER,
        rows_helper=ROWS_AND_COLUMNS_HELPER,
        ops=" → ".join(op.name for op in graph.ops),
        config=config.describe(),
        helpers=HELPERS,
        pointer_params=indent(pointer_params, 4),
        vector_loads=indent(vector_loads, 8),
        vector_outs=indent(vector_outs, 8),
        vec=vec,
        vector_body=indent(vector_body, 12),
        vector_stores=indent(vector_stores, 8),
        size_params="".join(f"    long long size{d},\n" for d in range(row_dims)),
        stride_params=",\n".join(
            "    " + ", ".join([f"long long in{i}_r{d}" for d in range(row_dims)]
                           + [f"long long in{i}_c"]) for i in used),
        coordinates=indent(coordinates, 12),
        row_offsets=indent(row_offsets, 12),
        rows_loads=indent(rows_loads, 16),
        rows_body=indent(rows_body, 16),
        rows_stores=indent(rows_stores, 16),
        threads=config.threads,
        blocks_per_sm=config.blocks_per_sm,
        vector_types="P" * n_pointers + "q",
        rows_types="P" * n_pointers + "qqii" + "q" * (n_sizes + n_strides),
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
        strides=", ".join(f"{x}.stride()" for x in tensors),
        row_dims=row_dims,
        stride_args=", ".join(f"*strides[{t}]" for t in range(len(used))),
        returns=", ".join(outs),
    )
