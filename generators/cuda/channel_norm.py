"""Tier-2 CUDA for group norm, instance norm and batch norm (batch statistics) that reads its
input once.

The values normalized together (a set: one sample's group of channels for group norm, one
sample's channel for instance norm, one channel over the batch for batch norm) are shared out
among the CLUSTER blocks of a sm_90 thread-block cluster. Each block computes the prologue over
its share and keeps the result in registers (every load of the share issued at once) or in
shared memory. Each thread sums its values and their squares shifted by its first value, the
threads' (count, mean, M2) states merge over the block, and each block sends its state to every
block of the cluster, which merge them (Chan et al.). Each block then normalizes its share,
applies the affine map and the epilogue, and stores. Global traffic is one read and one write.
The Triton kernels read twice: a 16 × 4096 fp32 group (256 KB) leaves L2 between its two walks,
and at 16×512×64² they sat just under the two thirds of the byte floor that two reads allow
(bench/results/rules_generator_h200.md, earlier table).

On an H200, group norm + SiLU 16×512×64² fp32 gained first from holding the share in
registers rather than shared memory, then from sending the moments by st.async in place of a
release cluster barrier (bench/NOTES.md, eighth round).

Sizes are compile-time constants, so each shape compiles once; strides are arguments.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from generators.channel_site import ChannelSite, channel_norm, stride_args, views
from generators.codegen import indent, op_refs, ops_needed
from generators.compiler.registers import held_limit
from generators.cuda.cluster import CLUSTER_HELPERS
from generators.cuda.cluster_shares import (
    CLUSTER_NORMS,
    SHARED_LIMIT,
    ClusterNormConfig,
    set_sizes,
    share_of,
    steps_of,
)
from generators.cuda.expressions import (
    HELPERS,
    cuda_elementwise,
    load_as_float,
    storage_type,
    store_from_float,
)
from generators.cuda.pointwise import RAW_VECTOR_TYPES
from generators.site_graph import Ref, SiteGraph, Unsupported

# A thread step's values go to and from shared memory as one vector of this type.
HELD_TYPES = {1: "float", 2: "float2", 4: "float4"}

def _nonblank(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.strip()]


# With vectors the kernel is written twice: once moving VEC values a thread step (one vector
# load or store a tensor, the coordinates found once a vector), used when every full input is
# contiguous and aligned, so that an element's offset is its 32-bit index; once a value at a
# time, for any strides. The vector kernel keeps its share in shared memory or in registers;
# the any-strides one, holding VEC times as many values a thread, in shared memory.
_KERNEL = """
__global__ void __cluster_dims__(CLUSTER, 1, 1) __launch_bounds__(THREADS)
{name}(
{pointer_params}
{stride_params})
{{
    __shared__ Moments scratch[32];
    __shared__ Inbox inbox;
    inbox_open(&inbox);
    const int set = blockIdx.x / CLUSTER;
    const int begin = (int)cluster_rank() * SHARE;
    const int end = min(begin + SHARE, SET_SIZE);
{set_coordinates}

    // Each thread sums its values and their squares shifted by its first value, which keeps
    // the variance free of cancellation without a second pass over the held values.
    float shift = 0.0f, shifted = 0.0f, squares = 0.0f;
    int steps = 0;
{statistics}
    // The threads' moments merged over the block, sent to every block of the cluster, and
    // merged there: lane r takes block r's.
    const float n = (float)(steps * {vec});
    const float offset = n > 0.0f ? __fdividef(shifted, n) : 0.0f;
    const Moments own = block_moments({{n, shift + offset, squares - shifted * offset}}, scratch);
    inbox_ready();
    inbox_send(&inbox, own.n, own.mean, own.m2);
    inbox_wait(&inbox);
    const unsigned int lane = threadIdx.x % 32;
    Moments block = {{0.0f, 0.0f, 0.0f}};
    if (lane < CLUSTER) {{
        const float4 sent = inbox.moments[lane];
        block = {{sent.x, sent.y, sent.z}};
    }}
    const Moments whole = warp_moments(block);
    const float mean = whole.mean;
    const float rstd = rsqrtf(whole.m2 / (float)SET_SIZE + EPS);
{output}
}}
"""

# The statistics step of one thread: the prologue's value of each lane kept, and summed.
_STATISTICS_STEP = """{statistics_coordinates}
{statistics_loads}
float* kept_lanes = reinterpret_cast<float*>(&{kept});
#pragma unroll
for (int j = 0; j < {vec}; ++j) {{
{statistics_lane}
    kept_lanes[j] = {x};
}}
if ({first}) {{
    shift = kept_lanes[0];
}}
#pragma unroll
for (int j = 0; j < {vec}; ++j) {{
    const float deviation = {deviation};
    shifted += deviation;
    squares += deviation * deviation;
}}"""

# The output step: the kept values normalized, the affine map and the epilogue, one store.
_OUTPUT_STEP = """{output_coordinates}
{output_loads}
const float* kept_lanes = reinterpret_cast<const float*>(&{kept});
{output_arrays}
#pragma unroll
for (int j = 0; j < {vec}; ++j) {{
    const float {x} = kept_lanes[j];
{output_lane}
}}
{stores}"""

_SHARED_STATISTICS = """#pragma unroll 4
for (int e = begin + threadIdx.x * {vec}; e < end; e += THREADS * {vec}) {{
    {held_type} kept;
{step}
    *reinterpret_cast<{held_type}*>(&held[e - begin]) = kept;
}}"""

_SHARED_OUTPUT = """#pragma unroll 2
for (int e = begin + threadIdx.x * {vec}; e < end; e += THREADS * {vec}) {{
    const {held_type} kept = *reinterpret_cast<const {held_type}*>(&held[e - begin]);
{step}
}}"""

# STEPS steps a thread, unrolled, so that every load of the share is in flight at once and the
# kept values are registers. Where the blocks' shares do not fill the set, a step past the end
# loads the share's last vector and counts nothing: a guard around the loads made each step
# wait for its own load before the next was issued (SASS, sm_90).
_REGISTER_STATISTICS = """{held_type} kept[STEPS];
#pragma unroll
for (int step = 0; step < STEPS; ++step) {{
{position}
    steps += inside;
{step}
}}"""

# The same steps out; only the stores are guarded, so the loads beside the kept values (the
# affine map's, the epilogue's) are not held back behind a branch each step.
_REGISTER_OUTPUT = """#pragma unroll
for (int step = 0; step < STEPS; ++step) {{
{position}
{step}
}}"""

_SOURCE = '''"""Kiln rules kernel (cuda, {kind} on a thread-block cluster): {ops}. {config}."""

import torch
import torch.nn as nn

from core.runtime.cuda import load_kernel

SOURCE = r"""{helpers}
#define CLUSTER {cluster}
#define THREADS {threads}
#define C {channels}
#define SPATIAL {spatial}
#define SET_SIZE {set_size}
#define SHARE {share}
#define STEPS {steps}
#define EPS {eps}f
{cluster_helpers}
extern __shared__ __align__(16) float held[];
{kernels}"""

SETS = {sets}
VEC = {vec}
SHARED_BYTES = {share} * 4
VECTOR_SHARED_BYTES = {vector_shared_bytes}


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.scalar = load_kernel(SOURCE, "cluster_{kind}", "{arg_types}")
        self.vector = load_kernel(SOURCE, "cluster_{kind}_vec", "{arg_types}") if VEC > 1 else None

    def forward(self, {params}):
        shape = {source}.shape
        assert tuple(shape) == {shape}, "the kernel was compiled for inputs of shape {shape}"
        n, c = shape[0], shape[1]
        spatial = {source}.numel() // max(n * c, 1)
{views}
{allocs}
        # Vectors need every full input contiguous and its runs of VEC aligned.
        vector = self.vector is not None and all(
            x.is_contiguous() and x.data_ptr() % (VEC * x.element_size()) == 0
            for x in ({full_views},))
        kernel = self.vector if vector else self.scalar
        kernel(grid=(SETS * {cluster}, 1, 1), block=({threads}, 1, 1),
               args=({pointer_args}, {stride_args}),
               shared_mem=VECTOR_SHARED_BYTES if vector else SHARED_BYTES)
        return {returns}
'''

_GROUP_SET = """const int sample = set / GROUPS;
const int first = (set % GROUPS) * (C / GROUPS);
const int base = (sample * C + first) * SPATIAL;"""
_BATCH_SET = "const int channel = set;"


# Where element e of a set lies: its sample, channel and position, and its offset `at` in the
# contiguous output (and, in the vector kernel, in every full input).
_GROUP_ELEMENT = ["const int channel = first + e / SPATIAL;", "const int p = e % SPATIAL;",
                  "const int at = base + e;"]
_BATCH_ELEMENT = ["const int sample = e / SPATIAL;", "const int p = e - sample * SPATIAL;",
                  "const int at = (sample * C + channel) * SPATIAL + p;"]


def _coordinates_used(lines: list[str], code: list[str]) -> list[str]:
    """The coordinate lines that `code` (or a line kept after them) reads."""
    kept: list[str] = []
    for line in reversed(lines):
        name = line.split("=")[0].split()[-1]
        if any(re.search(rf"\b{name}\b", text) for text in code + kept):
            kept.insert(0, line)
    return kept


@dataclass(frozen=True)
class _Pass:
    """One walk's code: what is loaded once a step (per-channel values, raw vectors of the full
    inputs) and what each of the step's VEC lanes computes."""

    loads: list[str]
    lane: list[str]


def _walk(graph: SiteGraph, site: ChannelSite, ops: set[int], inputs: set[int],
          held: set[int], vec: int, value: dict[Ref, str], anchor_value: str) -> _Pass:
    """The inputs (and those the ops read, but the `held` ones) loaded at the step's
    coordinates (at `at` with vectors, through the strides without), then the ops."""
    inputs = (inputs | {r.index for i in ops for r in op_refs(graph.ops[i]) if r.is_input}) - held
    loads, lane = [], []
    for i in sorted(inputs):
        dtype = graph.inputs[i].dtype
        if i in site.channel:
            element = f"in{i}[(long long)channel * in{i}_sc]"
            loads.append(f"const float x{i} = {load_as_float(dtype, element)};")
            continue
        raw, element = RAW_VECTOR_TYPES[vec * dtype.itemsize], storage_type(dtype)
        at = "at" if vec > 1 else (f"(long long)sample * in{i}_sn + (long long)channel * "
                                   f"in{i}_sc + (long long)p * in{i}_ss")
        loads += [f"const {raw} raw{i} = *reinterpret_cast<const {raw}*>(&in{i}[{at}]);",
                  f"const {element}* e{i} = reinterpret_cast<const {element}*>(&raw{i});"]
        lane.append(f"const float x{i} = {load_as_float(dtype, f'e{i}[j]')};")
    for i in sorted(ops):
        expression = anchor_value if i == site.anchor else cuda_elementwise(graph.ops[i], value)
        lane.append(f"const float v{i} = {expression};")
    return _Pass(loads, lane)


def write_cuda_channel_norm(graph: SiteGraph, config: ClusterNormConfig) -> str:
    """ModelNew for a site of one group_norm, instance_norm or training-mode batch_norm without
    running statistics, with elementwise ops on its input's shape."""
    if config.cluster not in (2, 4, 8) or config.threads % 32 or not 64 <= config.threads <= 1024 \
            or config.vector not in (1, 2, 4) or config.held not in ("shared", "registers"):
        raise Unsupported(f"{config.describe()}: clusters of 2, 4 or 8 blocks (portable on "
                          "sm_90), a multiple of 32 threads up to 1024, vectors of 1, 2 or 4, "
                          "values held in shared memory or registers")
    if config.held == "registers" and config.vector == 1:
        raise Unsupported("values held in registers need vectors: the kernel for any strides "
                          "holds its share in shared memory")
    norm = channel_norm(graph, CLUSTER_NORMS)
    site, anchor, weight, bias, groups = norm.site, norm.op, norm.weight, norm.bias, norm.groups
    kind = anchor.name
    n, c = site.shape[0], site.shape[1]
    spatial = math.prod(site.shape[2:])
    sets, set_size = set_sizes(norm)
    vec = config.vector
    if spatial % vec:
        raise Unsupported(f"{spatial} positions do not come in runs of {vec} for vectors")
    share = share_of(set_size, config.cluster, vec)
    steps = steps_of(share, config.threads, vec)
    if share * 4 > SHARED_LIMIT:
        raise Unsupported(f"a set of {set_size} values over {config.cluster} blocks is "
                          f"{share * 4 // 1024} KB a block, more shared memory than sm_90 has")
    in_registers = config.held == "registers"
    if in_registers and steps * vec > held_limit(config.threads):
        raise Unsupported(f"a share of {share} values is {steps * vec} a thread at "
                          f"{config.threads} threads, more than the "
                          f"{held_limit(config.threads)} registers can hold without "
                          "spilling: use more blocks or threads, or shared memory")
    if n * c * spatial >= 1 << 31 or set_size == 0:
        raise Unsupported(f"{n * c * spatial} values: the cluster kernel indexes a set with "
                          "32-bit integers and needs at least one value per set")
    source = anchor.args[0]
    value: dict[Ref, str] = {Ref(i, True): f"x{i}" for i in site.used}
    value.update({Ref(i, False): f"v{i}" for i in range(len(graph.ops))})
    x = value[source]
    affine = "".join(f" {sign} {value[p]}" for sign, p in (("*", weight), ("+", bias))
                     if isinstance(p, Ref))
    set_coordinates = _GROUP_SET if groups else _BATCH_SET
    outs = [f"out{k}" for k in range(len(graph.outputs))]
    pointer_params = [f"const {storage_type(graph.inputs[i].dtype)}* __restrict__ in{i},"
                      for i in site.used] + [
        f"{storage_type(graph.info(ref).dtype)}* __restrict__ out{k},"
        for k, ref in enumerate(graph.outputs)]
    stride_params = [f"long long in{i}_sc" if i in site.channel else
                     f"long long in{i}_sn, long long in{i}_sc, long long in{i}_ss"
                     for i in site.used]

    # Where the shares fill the set exactly, every step of every thread is in range.
    filled = set_size % (config.cluster * config.threads * vec) == 0
    # Only the vector kernel holds its share in registers, so its steps are VEC values wide.
    position = [f"const int e = begin + (step * THREADS + threadIdx.x) * {vec};",
                "const bool inside = true;"] if filled else [
        f"const int index = begin + (step * THREADS + threadIdx.x) * {vec};",
        "const bool inside = index < end;",
        f"const int e = min(index, end - {vec});"]

    def kernel(name: str, width: int, registers: bool) -> str:
        # Pass 1 loads the normalized value (or what it is computed from); pass 2 takes it from
        # registers or shared memory and loads only what the affine map and the epilogue read
        # beside it.
        source_input = {source.index} if source.is_input else set()
        statistics = _walk(graph, site, ops_needed(graph, [source], set()), source_input, set(),
                           width, value, "")
        output = _walk(graph, site, ops_needed(graph, list(graph.outputs), {source}), set(),
                       source_input, width, value, f"(({x} - mean) * rstd{affine})")
        arrays, lanes, stores = [], [], []
        coordinates = _GROUP_ELEMENT if groups else _BATCH_ELEMENT
        for k, ref in enumerate(graph.outputs):
            dtype = graph.info(ref).dtype
            raw, element = RAW_VECTOR_TYPES[width * dtype.itemsize], storage_type(dtype)
            arrays.append(f"{raw} packed{k};")
            arrays.append(f"{element}* o{k} = reinterpret_cast<{element}*>(&packed{k});")
            lanes.append(f"o{k}[j] = {store_from_float(dtype, value[ref])};")
            # One vector store (STG.E.128 for 4 fp32). Not evict-first: in a model the next op
            # reads the output, and back to back __stcs timed slower (bench/NOTES.md, seventh
            # round).
            stores.append(f"*reinterpret_cast<{raw}*>(&out{k}[at]) = packed{k};")
        if registers and not filled:
            stores = ["if (inside) {", *indent(stores, 4).splitlines(), "}"]
        kept = "kept[step]" if registers else "kept"
        statistics_step = _STATISTICS_STEP.format(
            statistics_coordinates="\n".join(_coordinates_used(
                coordinates, statistics.loads + statistics.lane)),
            statistics_loads="\n".join(statistics.loads),
            kept=kept, vec=width, statistics_lane=indent(statistics.lane, 4), x=x,
            first="step == 0" if registers else "steps++ == 0",
            deviation="kept_lanes[j] - shift" if filled or not registers else
            "inside ? kept_lanes[j] - shift : 0.0f")
        output_step = _OUTPUT_STEP.format(
            output_coordinates="\n".join(_coordinates_used(
                coordinates, output.loads + output.lane + lanes + stores)),
            output_loads="\n".join(output.loads), kept=kept, output_arrays="\n".join(arrays),
            vec=width, x=x, output_lane=indent(output.lane + lanes, 4),
            stores="\n".join(stores))
        held_type = HELD_TYPES[width]
        if registers:
            steps_at = indent(position, 4)
            statistics_walk = _REGISTER_STATISTICS.format(
                held_type=held_type, position=steps_at,
                step=indent(_nonblank(statistics_step), 4))
            output_walk = _REGISTER_OUTPUT.format(position=steps_at,
                                                  step=indent(_nonblank(output_step), 4))
        else:
            statistics_walk = _SHARED_STATISTICS.format(
                vec=width, held_type=held_type, step=indent(_nonblank(statistics_step), 4))
            output_walk = _SHARED_OUTPUT.format(
                vec=width, held_type=held_type, step=indent(_nonblank(output_step), 4))
        return _KERNEL.format(
            name=name,
            vec=width,
            pointer_params=indent(pointer_params, 4),
            stride_params=indent([p + ("," if k < len(stride_params) - 1 else "")
                                  for k, p in enumerate(stride_params)], 4),
            set_coordinates=indent(set_coordinates.splitlines(), 4),
            statistics=indent(statistics_walk.splitlines(), 4),
            output=indent(output_walk.splitlines(), 4),
        )

    kernels = kernel(f"cluster_{kind}", 1, False) + (
        kernel(f"cluster_{kind}_vec", vec, in_registers) if vec > 1 else "")
    row_source = f"in{site.full[0]}"
    defines = f"#define GROUPS {groups}\n" if groups else ""
    return _SOURCE.format(
        kind=kind,
        ops=" → ".join(op.name for op in graph.ops),
        config=config.describe(),
        helpers=HELPERS + defines,
        cluster=config.cluster,
        threads=config.threads,
        channels=c,
        spatial=spatial,
        set_size=set_size,
        share=share,
        steps=steps,
        eps=repr(norm.eps),
        cluster_helpers=CLUSTER_HELPERS,
        kernels=kernels,
        sets=sets,
        vec=vec,
        vector_shared_bytes=0 if in_registers else share * 4,
        arg_types="P" * len(pointer_params) + "q" * sum(
            1 if i in site.channel else 3 for i in site.used),
        params=", ".join(f"in{i}" for i in range(len(graph.inputs))),
        source=row_source,
        shape=tuple(site.shape),
        views=indent(views(site), 8),
        allocs=indent([f"out{k} = torch.empty(shape, device={row_source}.device, "
                       f"dtype={graph.info(ref).dtype})" for k, ref in enumerate(graph.outputs)],
                      8),
        full_views=", ".join(f"x{i}" for i in site.full),
        pointer_args=", ".join([f"x{i}" for i in site.used] + outs),
        stride_args=stride_args(site).rstrip(", "),
        returns=", ".join(outs),
    )

