"""Tier-1 Triton for batch norm with the batch's statistics (training mode, no running stats).

The input (N, C, *spatial) is read as (N, C, S); each channel is normalized by the mean and
biased variance over its N × S values. A channel's values, numbered sample-major, are cut into
tiles of BLOCK consecutive values shared out among SPLITS programs, so that C × SPLITS
programs fill the GPU even with few channels. A tile may cross from one sample to the next,
so every lane holds a value whatever S is (a tile of one sample's positions left a quarter of
the lanes idle at S = 56²; crossing gained a little at 32×256×56² fp32 on an H200:
bench/NOTES.md, fourth round). The statistics kernel folds each program's tiles (through the
elementwise prologue) into per-lane Welford states in fp32 and writes one (count, mean, M2)
per program; the normalizing kernel takes the same tiles in reverse order (those read last
are still in L2), merges its channel's SPLITS states (Chan et al.), and applies the
normalization, the per-channel affine map and the epilogue.
Updates of running statistics are a mutation of module buffers and stay with PyTorch.
"""

from __future__ import annotations

from dataclasses import dataclass

from generators.channel_site import (
    ChannelSite,
    channel_norm,
    statistics_inputs,
    stride_args,
    stride_params,
    views,
)
from generators.codegen import SM_COUNT_LINE, indent
from generators.site_graph import Ref, SiteGraph
from generators.triton.expressions import with_jit_helpers
from generators.triton.group_norm import elementwise_lines, normalized_output


@dataclass(frozen=True)
class BatchNormConfig:
    block: int = 1024  # consecutive values of a channel per tile
    programs_per_sm: int = 4  # channels × splits per channel ≈ this many programs per SM
    num_warps: int = 4

    def describe(self) -> str:
        return (f"each channel split over about {self.programs_per_sm} programs per SM, tiles "
                f"of {self.block}, {self.num_warps} warps")


# Tile t of a channel covers its values t * BLOCK... (value v: sample v // SPATIAL, position
# v % SPATIAL); program `split` takes tiles split, split + SPLITS, ...
_TILE = """t = split + step * SPLITS
values = t * BLOCK + tl.arange(0, BLOCK)
samples = values // SPATIAL
positions = values % SPATIAL
mask = values < N * SPATIAL"""

_SOURCE = '''"""Kiln rules kernel (triton, batch_norm with batch statistics): {ops}. {config}."""

import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def batch_stats_kernel(
{stat_pointer_params}
    partial_ptr,
{stat_stride_params}
    N: tl.constexpr,
    SPATIAL: tl.constexpr,
    SPLITS: tl.constexpr,
    BLOCK: tl.constexpr,
    STEPS: tl.constexpr,
):
    channel = tl.program_id(0)
    split = tl.program_id(1)
    count = tl.zeros([BLOCK], tl.float32)
    mean = tl.zeros([BLOCK], tl.float32)
    m2 = tl.zeros([BLOCK], tl.float32)
{stat_channel_loads}
    for step in range(STEPS):
{tile}
{stat_loads}
{stat_prologue}
        count += tl.where(mask, 1.0, 0.0)
        delta = tl.where(mask, {x} - mean, 0.0)
        mean += tl.fdiv(delta, tl.maximum(count, 1.0), ieee_rounding=False)
        m2 += tl.where(mask, delta * ({x} - mean), 0.0)
    total = tl.sum(count)
    split_mean = tl.sum(count * mean) / tl.maximum(total, 1.0)
    spread = mean - split_mean
    slot = channel * SPLITS + split
    n_slots = tl.num_programs(0) * SPLITS
    tl.store(partial_ptr + slot, total)
    tl.store(partial_ptr + n_slots + slot, split_mean)
    tl.store(partial_ptr + 2 * n_slots + slot, tl.sum(m2) + tl.sum(count * spread * spread))


@triton.jit
def batch_norm_kernel(
{pointer_params}
    partial_ptr,
{stride_params}
    N: tl.constexpr,
    C: tl.constexpr,
    SPATIAL: tl.constexpr,
    SPLITS: tl.constexpr,
    BLOCK: tl.constexpr,
    STEPS: tl.constexpr,
    BLOCK_SPLITS: tl.constexpr,
):
    # Channels, splits and steps run in the reverse of the statistics kernel's order, so the
    # tiles it read last, still in L2, are read first.
    channel = C - 1 - tl.program_id(0)
    split = SPLITS - 1 - tl.program_id(1)
    # Chan et al.: the channel's statistics from its SPLITS partial (count, mean, M2) states.
    slots = channel * SPLITS + tl.arange(0, BLOCK_SPLITS)
    held = tl.arange(0, BLOCK_SPLITS) < SPLITS
    counts = tl.load(partial_ptr + slots, mask=held, other=0.0)
    means = tl.load(partial_ptr + C * SPLITS + slots, mask=held, other=0.0)
    m2s = tl.load(partial_ptr + 2 * C * SPLITS + slots, mask=held, other=0.0)
    total = tl.sum(counts)
    channel_mean = tl.sum(counts * means) / total
    spread = means - channel_mean
    rstd = tl.rsqrt((tl.sum(m2s) + tl.sum(counts * spread * spread)) / total + {eps})
{channel_loads}
    for back in range(STEPS):
        step = STEPS - 1 - back
{tile}
{loads}
{prologue}
        y = ({x} - channel_mean) * rstd{affine}
{epilogue}
        offsets = samples * (C * SPATIAL) + channel * SPATIAL + positions
{stores}


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, {params}):
        shape = {source}.shape
        assert len(shape) == {rank}, "the kernel was written for rank-{rank} inputs"
        n, c = shape[0], shape[1]
        spatial = {source}.numel() // max(n * c, 1)
        assert n * spatial > 0 and c > 0, "batch statistics need at least one value per channel"
{views}
{allocs}
        tiles = triton.cdiv(n * spatial, {block})
        device = {source}.device
        {sm_count}
        splits = max(1, min(tiles, triton.cdiv({programs_per_sm} * sms, c)))
        partial = torch.empty((3, c, splits), device=device, dtype=torch.float32)
        tiling = dict(N=n, SPATIAL=spatial, SPLITS=splits, BLOCK={block},
                      STEPS=triton.cdiv(tiles, splits), num_warps={num_warps})
        batch_stats_kernel[(c, splits)](
            {stat_pointer_args},
            partial,
            {stat_stride_args}
            **tiling,
        )
        batch_norm_kernel[(c, splits)](
            {pointer_args},
            partial,
            {stride_args}
            C=c,
            BLOCK_SPLITS=triton.next_power_of_2(splits),
            **tiling,
        )
        return {returns}
'''


def _tile_loads(site: ChannelSite, needed: set[int]) -> list[str]:
    """Loads of a tile of BLOCK consecutive values of one channel's full inputs."""
    return [f"x{i} = tl.load(in{i}_ptr + samples * in{i}_sn + channel * in{i}_sc + "
            f"positions * in{i}_ss, mask=mask, other=0.0).to(tl.float32)"
            for i in sorted(needed) if i not in site.channel]


def _channel_loads(site: ChannelSite, needed: set[int]) -> list[str]:
    """The channel's one value of each per-channel input, loaded once per program."""
    return [f"x{i} = tl.load(in{i}_ptr + channel * in{i}_sc).to(tl.float32)"
            for i in sorted(needed) if i in site.channel]


def write_batch_norm(graph: SiteGraph, config: BatchNormConfig) -> str:
    """ModelNew for a site of one training-mode F.batch_norm without running statistics."""
    norm = channel_norm(graph, ("batch_norm",))
    site, anchor, weight, bias, eps = norm.site, norm.op, norm.weight, norm.bias, norm.eps
    r = site.anchor
    source = anchor.args[0]
    before = list(enumerate(graph.ops[:r]))
    stat_inputs = statistics_inputs(graph, r, source)
    stat_used = sorted(stat_inputs)

    value = {Ref(i, True): f"x{i}" for i in site.used}
    stat_loads = _tile_loads(site, stat_inputs)
    stat_prologue = elementwise_lines(before, dict(value))
    loads = _tile_loads(site, set(site.used))
    prologue = elementwise_lines(before, value)
    output = normalized_output(graph, value, weight, bias, r)
    stat_site = ChannelSite(r, site.shape, stat_used, site.full, site.channel)
    row_source = f"in{site.full[0]}"
    outs = [f"out{k}" for k in range(len(graph.outputs))]
    return with_jit_helpers(_SOURCE.format(
        ops=" → ".join(op.name for op in graph.ops),
        config=config.describe(),
        stat_pointer_params=indent([f"in{i}_ptr," for i in stat_used], 4),
        pointer_params=indent([f"in{i}_ptr," for i in site.used] + [f"{o}_ptr," for o in outs],
                              4),
        stride_params=indent(stride_params(site), 4),
        tile=indent(_TILE.splitlines(), 8),
        stat_stride_params=indent(stride_params(stat_site), 4),
        stat_channel_loads=indent(_channel_loads(site, stat_inputs), 4),
        stat_loads=indent(stat_loads, 8),
        stat_prologue=indent(stat_prologue, 8),
        x=value[source],
        eps=repr(float(eps)),
        channel_loads=indent(_channel_loads(site, set(site.used)), 4),
        loads=indent(loads, 8),
        prologue=indent(prologue, 8),
        affine=output.affine,
        epilogue=indent(output.epilogue, 8),
        stores=indent(output.stores, 8),
        params=", ".join(f"in{i}" for i in range(len(graph.inputs))),
        source=row_source,
        rank=len(site.shape),
        views=indent(views(site), 8),
        allocs=indent([f"{o} = torch.empty(shape, device={row_source}.device, "
                       f"dtype={graph.info(ref).dtype})"
                       for o, ref in zip(outs, graph.outputs, strict=True)], 8),
        block=config.block,
        programs_per_sm=config.programs_per_sm,
        sm_count=SM_COUNT_LINE,
        num_warps=config.num_warps,
        stat_pointer_args=", ".join(f"x{i}" for i in stat_site.used),
        pointer_args=", ".join([f"x{i}" for i in site.used] + outs),
        stride_args=stride_args(site),
        stat_stride_args=stride_args(stat_site),
        returns=", ".join(outs),
    ))
