"""Tier-2 CUDA for `reduction` sites: row reductions over the last dimension, fused end to end.

A block holds ROWS rows with THREADS / ROWS threads each. Pass 1 walks the row, computes the
prologue (the ops before the reduction) per element and folds it into per-thread state (online
max and sum for softmax, Welford count/mean/M2 for layer norm, a sum or a max otherwise); warp
shuffles merge the state within a warp and, when a row spans several warps, shared memory merges
the warps. Pass 2, needed when the site returns a row-shaped result, walks the row again and
writes the normalized value through the epilogue. Inputs are read through their strides
(broadcasts are stride 0), so weights, biases and strided inputs need no copies.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from generators.codegen import BROADCAST_SHAPE_HELPER, indent, op_refs, ops_needed
from generators.cuda.expressions import (
    HELPERS,
    cuda_elementwise,
    load_as_float,
    storage_type,
    store_from_float,
)
from generators.cuda.pointwise import used_inputs
from generators.site_graph import Op, Ref, SiteGraph, Unsupported

SUM_KINDS = ("sum", "mean", "amax")
NORM_KINDS = ("softmax", "log_softmax", "layer_norm", "rms_norm")
NEG_INF = "__int_as_float(0xff800000)"

MERGES = r"""
__device__ __forceinline__ void sum_merge(float& a, float b) {
    a += b;
}

__device__ __forceinline__ void max_merge(float& a, float b) {
    a = nan_max(a, b);
}

// Online softmax: (max, sum of exp(x - max)) pairs merge by rescaling to the larger max.
__device__ __forceinline__ void softmax_merge(float& m, float& s, float m2, float s2) {
    const float top = fmaxf(m, m2);
    if (top == __int_as_float(0xff800000)) {
        return;  // both sides saw only -inf: nothing to add yet
    }
    s = s * expf(m - top) + s2 * expf(m2 - top);
    m = top;
}

// Chan et al.: merge two (count, mean, M2) Welford states.
__device__ __forceinline__ void welford_merge(float& n, float& mean, float& m2,
                                              float n2, float mean2, float m22) {
    const float total = n + n2;
    if (total == 0.0f) {
        return;
    }
    const float delta = mean2 - mean;
    const float share = n2 / total;
    mean += delta * share;
    m2 += m22 + delta * delta * n * share;
    n = total;
}
"""

# Per kind: the per-thread state (name, initial value) and its merge function.
_STATE = {
    "sum": ([("acc", "0.0f")], "sum_merge"),
    "mean": ([("acc", "0.0f")], "sum_merge"),
    "rms_norm": ([("acc", "0.0f")], "sum_merge"),
    "amax": ([("acc", NEG_INF)], "max_merge"),
    "softmax": ([("row_max", NEG_INF), ("row_sum", "0.0f")], "softmax_merge"),
    "log_softmax": ([("row_max", NEG_INF), ("row_sum", "0.0f")], "softmax_merge"),
    "layer_norm": ([("count", "0.0f"), ("mean", "0.0f"), ("m2", "0.0f")], "welford_merge"),
}


@dataclass(frozen=True)
class CudaReductionConfig:
    threads: int = 256  # per block
    rows_per_block: int = 1  # rows share a block; each gets threads / rows_per_block threads

    @property
    def threads_per_row(self) -> int:
        return self.threads // self.rows_per_block

    def describe(self) -> str:
        return f"{self.threads} threads, {self.rows_per_block} row(s) per block"


_SOURCE = '''"""Kiln rules kernel (cuda, reduction): {ops}. {config}."""

import torch
import torch.nn as nn

from core.runtime.cuda import load_kernel

SOURCE = r"""{helpers}{merges}
#define ROWS {rows}
#define THREADS_PER_ROW {threads_per_row}
#define WARPS_PER_ROW {warps_per_row}

__global__ void row_{kind}(
{pointer_params}
    long long n_rows,
    long long n_cols{size_params}{stride_params})
{{
    const int t = threadIdx.x % THREADS_PER_ROW;
    const int row_in_block = threadIdx.x / THREADS_PER_ROW;
    const long long row = (long long)blockIdx.x * ROWS + row_in_block;
    // Rows past the end still take part in the shuffles and barriers, over zero columns.
    const long long cols = row < n_rows ? n_cols : 0;
    long long rest = row < n_rows ? row : 0;
{row_coordinates}
{row_bases}

{state}
    for (long long c = t; c < cols; c += THREADS_PER_ROW) {{
{pass1_body}
        {update};
    }}

#pragma unroll
    for (int offset = {first_offset}; offset > 0; offset >>= 1) {{
        {merge}({state_names},
            {shuffled});
    }}
{block_merge}
{row_work}{pass2}}}
"""

THREADS = {threads}
ROWS = {rows}


{broadcast_helper}

class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.kernel = load_kernel(SOURCE, "row_{kind}", "{arg_types}")

    def forward(self, {params}):
        shape = _broadcast_shape([{shapes}])
        assert len(shape) == {rank}, "the kernel was written for rank-{rank} rows"
{views}
        n_cols = shape[-1]
        n_rows = 1
        for size in shape[:-1]:
            n_rows *= size
{allocs}
        if n_rows > 0:
            self.kernel(grid=((n_rows + ROWS - 1) // ROWS, 1, 1), block=(THREADS, 1, 1),
                        args=({pointer_args}, n_rows, n_cols, {size_args}{stride_args}))
        return {returns}
'''

_BLOCK_MERGE = """
    __shared__ float {parts};
    const int lane = t % 32;
    const int warp = t / 32;
    if (lane == 0) {{
{publish}
    }}
    __syncthreads();
{gather}
#pragma unroll
    for (int w = 1; w < WARPS_PER_ROW; ++w) {{
        {merge}({state_names}, {gathered});
    }}"""

_PASS2 = """
    for (long long c = t; c < cols; c += THREADS_PER_ROW) {{
{body}
{stores}
    }}
"""


def _dim(op: Op) -> object:
    return op.kwarg("dim", op.args[1] if len(op.args) > 1 else None)


def _anchor(graph: SiteGraph) -> int:
    anchors = [i for i, op in enumerate(graph.ops) if op.kind.value == "reduction"]
    if len(anchors) != 1:
        raise Unsupported(f"the site has {len(anchors)} reductions; the CUDA rules fuse one")
    index = anchors[0]
    op = graph.ops[index]
    if op.name not in SUM_KINDS + NORM_KINDS:
        raise Unsupported(f"no CUDA row rule for {op.name}")
    if not isinstance(op.args[0], Ref):
        raise Unsupported(f"{op.name} of a constant")
    rank = len(graph.info(op.args[0]).shape)
    if rank == 0:
        raise Unsupported(f"{op.name} of a zero-dimensional tensor")
    if op.name in ("layer_norm", "rms_norm"):
        normalized = op.kwarg("normalized_shape", op.args[1] if len(op.args) > 1 else None)
        if not isinstance(normalized, tuple) or len(normalized) != 1:
            raise Unsupported(f"{op.name} over {normalized}: the CUDA rules normalize the last "
                              "dimension only")
        return index
    dim = _dim(op)
    if isinstance(dim, tuple) and len(dim) == 1:
        dim = dim[0]
    if not isinstance(dim, int) or dim not in (-1, rank - 1):
        raise Unsupported(f"{op.name} over dim {dim!r}: the CUDA rules reduce the last "
                          "dimension of a row")
    dtypes = [a for a in (*op.args, op.kwarg("dtype")) if isinstance(a, torch.dtype)]
    if dtypes:
        raise Unsupported(f"{op.name} with dtype={dtypes[0]}: the CUDA rules keep the "
                          "input's dtype")
    return index


def _finalize(op: Op, kind: str, x: str, value: dict[Ref, str]) -> tuple[list[str], str]:
    """Row statistics from the merged state, and the expression of the anchor's result."""
    if kind == "sum":
        return [], "acc"
    if kind == "mean":
        return [], "(acc / (float)n_cols)"
    if kind == "amax":
        return [], "acc"
    if kind == "softmax":
        return ["const float inv_sum = 1.0f / row_sum;"], f"(expf({x} - row_max) * inv_sum)"
    if kind == "log_softmax":
        return ["const float log_sum = logf(row_sum);"], f"({x} - row_max - log_sum)"

    def arg(name: str, position: int) -> object:
        return op.kwarg(name, op.args[position] if len(op.args) > position else None)

    eps = arg("eps", 4 if kind == "layer_norm" else 3)
    if eps is None:
        # PyTorch's rms_norm upcasts half and bfloat16 rows and takes fp32's epsilon.
        eps = 1e-5 if kind == "layer_norm" else torch.finfo(torch.float32).eps
    weight = arg("weight", 2)
    result = f"({x} - mean) * rstd" if kind == "layer_norm" else f"{x} * rstd"
    if weight is not None:
        result = f"({result}) * {value[weight]}"
    bias = arg("bias", 3) if kind == "layer_norm" else None
    if bias is not None:
        result = f"({result}) + {value[bias]}"
    square_mean = "m2" if kind == "layer_norm" else "acc"
    return [f"const float rstd = rsqrtf({square_mean} / (float)n_cols + {float(eps)!r}f);"], \
        f"({result})"


def write_cuda_reduction(graph: SiteGraph, config: CudaReductionConfig) -> str:
    """The ModelNew source computing `graph`'s row reduction and its fused ops in one kernel."""
    tpr, rows = config.threads_per_row, config.rows_per_block
    if config.threads % rows or tpr & (tpr - 1) or not 1 <= tpr <= 1024 or \
            config.threads % 32 or config.threads > 1024:
        raise Unsupported(f"{config.describe()}: threads must be a multiple of 32 up to 1024, "
                          "split into a power of two per row")
    anchor_index = _anchor(graph)
    anchor = graph.ops[anchor_index]
    kind = anchor.name
    anchor_ref = Ref(anchor_index, False)
    reduced = anchor.args[0]
    row_shape = graph.info(reduced).shape
    rank = len(row_shape)

    # Which values are one per row (the reduction of a sum kind and what follows from it alone)
    # and which are one per element of the row.
    row_level: set[Ref] = {anchor_ref} if kind in SUM_KINDS else set()
    for i, op in enumerate(graph.ops):
        refs = op_refs(op)
        if i > anchor_index and refs and all(r in row_level for r in refs):
            row_level.add(Ref(i, False))
    for i, op in enumerate(graph.ops):
        if i == anchor_index or Ref(i, False) in row_level:
            continue
        if op.kind.value not in ("pointwise", "view"):
            raise Unsupported(f"{op.name} is not elementwise")
        trailing = row_shape[rank - len(op.out.shape):]
        fits = len(op.out.shape) <= rank and all(
            size in (1, row) for size, row in zip(op.out.shape, trailing, strict=True))
        if not fits:
            raise Unsupported(f"{op.name} makes {tuple(op.out.shape)}, wider than the "
                              f"reduced rows {row_shape}")
    for ref in graph.outputs:
        info = graph.info(ref)
        if ref in row_level and info.shape != anchor.out.shape:
            raise Unsupported(f"an output of shape {info.shape}, not the reduction's "
                              f"{anchor.out.shape}")
        if ref not in row_level and info.shape != row_shape:
            raise Unsupported(f"an output of shape {info.shape}, not the rows' {row_shape}")

    used = used_inputs(graph)
    value: dict[Ref, str] = {Ref(i, True): f"x{i}" for i in used}
    value.update({Ref(i, False): f"v{i}" for i in range(len(graph.ops))})

    def element_lines(indices: set[int], inputs: set[int]) -> list[str]:
        """Loads of the inputs the ops read (and `inputs`), then the ops in graph order."""
        inputs = inputs | {r.index for i in indices for r in op_refs(graph.ops[i]) if r.is_input}
        lines = []
        for i in sorted(inputs):
            element = f"in{i}[base{i} + c * in{i}_s{rank - 1}]"
            lines.append(f"const float x{i} = {load_as_float(graph.inputs[i].dtype, element)};")
        for i in sorted(indices):
            expression = (anchor_value if i == anchor_index
                          else cuda_elementwise(graph.ops[i], value))
            lines.append(f"const float v{i} = {expression};")
        return lines

    x = value[reduced]
    stats, anchor_value = _finalize(anchor, kind, x, value)
    pass1_body = element_lines(ops_needed(graph, [reduced], set()),
                               {reduced.index} if reduced.is_input else set())
    state, merge = _STATE[kind]
    names = [name for name, _ in state]
    update = {
        "sum_merge": f"sum_merge(acc, {x})",
        "max_merge": f"max_merge(acc, {x})",
        "softmax_merge": f"softmax_merge(row_max, row_sum, {x}, 1.0f)",
        "welford_merge": f"welford_merge(count, mean, m2, 1.0f, {x}, 0.0f)",
    }[merge]
    if kind == "rms_norm":
        update = f"sum_merge(acc, {x} * {x})"

    warps_per_row = max(1, tpr // 32)
    block_merge = ""
    if warps_per_row > 1:
        block_merge = _BLOCK_MERGE.format(
            parts=", ".join(f"part_{n}[ROWS][WARPS_PER_ROW]" for n in names),
            publish=indent([f"part_{n}[row_in_block][warp] = {n};" for n in names], 8),
            gather=indent([f"{n} = part_{n}[row_in_block][0];" for n in names], 4),
            merge=merge, state_names=", ".join(names),
            gathered=", ".join(f"part_{n}[row_in_block][w]" for n in names),
        )

    row_outputs = [(k, r) for k, r in enumerate(graph.outputs) if r in row_level]
    element_outputs = [(k, r) for k, r in enumerate(graph.outputs) if r not in row_level]
    row_ops = sorted(r.index for r in row_level)
    row_body = []
    for i in row_ops:
        expression = anchor_value if i == anchor_index else cuda_elementwise(graph.ops[i], value)
        row_body.append(f"const float v{i} = {expression};")
    row_stores = []
    if row_outputs:
        row_stores = ["if (row < n_rows && t == 0) {"] + [
            f"    out{k}[row] = {store_from_float(graph.info(r).dtype, value[r])};"
            for k, r in row_outputs] + ["}"]
    pass2 = ""
    if element_outputs:
        needed = ops_needed(graph, [r for _, r in element_outputs], row_level)
        stores = [f"out{k}[row * n_cols + c] = "
                  f"{store_from_float(graph.info(r).dtype, value[r])};" for k, r in element_outputs]
        pass2 = _PASS2.format(body=indent(element_lines(needed, set()), 8),
                              stores=indent(stores, 8))

    pointer_params = (
        [f"const {storage_type(graph.inputs[i].dtype)}* __restrict__ in{i}," for i in used]
        + [f"{storage_type(graph.info(r).dtype)}* __restrict__ out{k},"
           for k, r in enumerate(graph.outputs)])
    row_coordinates = []
    for d in range(rank - 2, 0, -1):
        row_coordinates += [f"const long long r{d} = rest % size{d};", f"rest /= size{d};"]
    if rank > 1:
        row_coordinates.append("const long long r0 = rest;")
    row_bases = [f"const long long base{i} = "
                 + (" + ".join(f"r{d} * in{i}_s{d}" for d in range(rank - 1)) or "0") + ";"
                 for i in used]
    keepdim = anchor.kwarg("keepdim", anchor.args[2] if len(anchor.args) > 2 else False)
    row_out_shape = "shape[:-1] + (1,)" if keepdim else "shape[:-1]"
    allocs = [f"out{k} = torch.empty({row_out_shape if r in row_level else 'shape'}, "
              f"device=in{used[0]}.device, dtype={graph.info(r).dtype})"
              for k, r in enumerate(graph.outputs)]
    n_sizes, n_strides = max(0, rank - 2), rank * len(used)
    outs = [f"out{k}" for k in range(len(graph.outputs))]
    return _SOURCE.format(
        broadcast_helper=BROADCAST_SHAPE_HELPER,
        ops=" → ".join(op.name for op in graph.ops),
        config=config.describe(),
        helpers=HELPERS,
        merges=MERGES,
        rows=rows,
        threads_per_row=tpr,
        warps_per_row=warps_per_row,
        kind=kind,
        pointer_params=indent(pointer_params, 4),
        size_params="".join(f",\n    long long size{d}" for d in range(1, rank - 1)),
        stride_params="".join(f",\n    long long in{i}_s{d}" for i in used for d in range(rank)),
        row_coordinates=indent(row_coordinates, 4),
        row_bases=indent(row_bases, 4),
        state=indent([f"float {n} = {init};" for n, init in state], 4),
        pass1_body=indent(pass1_body, 8),
        update=update,
        first_offset=min(16, tpr // 2),
        merge=merge,
        state_names=", ".join(names),
        shuffled=",\n            ".join(f"__shfl_xor_sync(0xffffffff, {n}, offset)" for n in names),
        block_merge=block_merge,
        row_work="\n" + "".join(f"    {line}\n" for line in [*stats, *row_body, *row_stores]),
        pass2=pass2,
        threads=config.threads,
        arg_types="P" * len(pointer_params) + "q" * (2 + n_sizes + n_strides),
        params=", ".join(f"in{i}" for i in range(len(graph.inputs))),
        shapes=", ".join(f"in{i}.shape" for i in used),
        rank=rank,
        views=indent([f"x{i} = in{i}.expand(shape)" for i in used], 8),
        allocs=indent(allocs, 8),
        pointer_args=", ".join([f"x{i}" for i in used] + outs),
        size_args="".join(f"shape[{d}], " for d in range(1, rank - 1)),
        stride_args="".join(f"*x{i}.stride(), " for i in used),
        returns=", ".join(outs),
    )
