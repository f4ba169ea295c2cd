"""Tier-1 Triton for batch norm with the batch's statistics (training mode, no running stats).

The input (N, C, *spatial) is read as (N, C, S); each channel is normalized by the mean and
biased variance over its N × S values, walked in [BLOCK_R samples, BLOCK_S positions] tiles.
Statistics are per-lane Welford states in fp32 (through the elementwise prologue), merged
across lanes and programs by Chan et al.'s formula. Two layouts:
- split: a channel's tiles are shared out among SPLITS programs, so that C × SPLITS programs
  fill the GPU even with few channels. A statistics kernel writes one (count, mean, M2) per
  program; the normalizing kernel merges its channel's SPLITS states and applies the
  normalization, the per-channel affine map and the epilogue. The input is read twice from
  memory.
- one program per channel: the program computes its channel's statistics, then normalizes the
  channel, one launch. With at most `programs_per_sm` × SMs programs in flight the channels
  they hold stay in L2 between the two loops, so the input is read once from memory.
Updates of running statistics are a mutation of module buffers and stay with PyTorch.
"""

from __future__ import annotations

from dataclasses import dataclass

from generators.codegen import arg, indent
from generators.expressions import tl_dtype
from generators.site_graph import Ref, SiteGraph, Unsupported
from generators.triton_group_norm import (
    ChannelSite,
    channel_site,
    elementwise_lines,
    inputs_of,
    stride_args,
    stride_params,
    views,
)


@dataclass(frozen=True)
class BatchNormConfig:
    block: int = 1024  # elements per tile: BLOCK_S positions × BLOCK_R samples
    # split: channels × splits ≈ this many programs per SM. One program per channel: at most
    # this many per SM, each looping over channels.
    programs_per_sm: int = 4
    num_warps: int = 4
    one_program_per_channel: bool = False

    def describe(self) -> str:
        if self.one_program_per_channel:
            return (f"one program per channel (at most {self.programs_per_sm} per SM): "
                    f"statistics, then normalization from L2, tiles of {self.block}, "
                    f"{self.num_warps} warps")
        return (f"each channel split over about {self.programs_per_sm} programs per SM, tiles "
                f"of {self.block}, {self.num_warps} warps")


# Tile t of a channel covers samples (t // S_TILES) * BLOCK_R... and positions
# (t % S_TILES) * BLOCK_S...; program `split` takes tiles split, split + SPLITS, ...
_TILE = """t = split + step * SPLITS
samples = (t // S_TILES) * BLOCK_R + tl.arange(0, BLOCK_R)
positions = (t % S_TILES) * BLOCK_S + tl.arange(0, BLOCK_S)
mask = ((samples < N) & (t < TILES))[:, None] & (positions < SPATIAL)[None, :]"""
_CHANNEL_TILE = """samples = (t // S_TILES) * BLOCK_R + tl.arange(0, BLOCK_R)
positions = (t % S_TILES) * BLOCK_S + tl.arange(0, BLOCK_S)
mask = (samples < N)[:, None] & (positions < SPATIAL)[None, :]"""
# One more value into each lane's (count, mean, M2).
_WELFORD = """count += tl.where(mask, 1.0, 0.0)
delta = tl.where(mask, {x} - mean, 0.0)
mean += delta / tl.maximum(count, 1.0)
m2 += tl.where(mask, delta * ({x} - mean), 0.0)"""

_MODULE_HEAD = (
    '''"""Kiln rules kernel (triton, batch_norm with batch statistics): {ops}. {config}."""

import torch
import torch.nn as nn
import triton
import triton.language as tl

''')

_SPLIT_KERNELS = '''
@triton.jit
def batch_stats_kernel(
{stat_pointer_params}
    partial_ptr,
{stat_stride_params}
    N: tl.constexpr,
    SPATIAL: tl.constexpr,
    SPLITS: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_S: tl.constexpr,
    S_TILES: tl.constexpr,
    TILES: tl.constexpr,
    STEPS: tl.constexpr,
):
    channel = tl.program_id(0)
    split = tl.program_id(1)
    count = tl.zeros([BLOCK_R, BLOCK_S], tl.float32)
    mean = tl.zeros([BLOCK_R, BLOCK_S], tl.float32)
    m2 = tl.zeros([BLOCK_R, BLOCK_S], tl.float32)
{stat_channel_loads}
    for step in range(STEPS):
{tile}
{stat_loads}
{stat_prologue}
{welford}
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
    BLOCK_R: tl.constexpr,
    BLOCK_S: tl.constexpr,
    S_TILES: tl.constexpr,
    TILES: tl.constexpr,
    STEPS: tl.constexpr,
    BLOCK_SPLITS: tl.constexpr,
):
    channel = tl.program_id(0)
    split = tl.program_id(1)
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
    for step in range(STEPS):
{tile}
{loads}
{prologue}
        y = ({x} - channel_mean) * rstd{affine}
{epilogue}
        offsets = samples[:, None] * (C * SPATIAL) + channel * SPATIAL + positions[None, :]
{stores}
'''

_FORWARD_HEAD = '''

class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, {params}):
        shape = {source}.shape
        assert len(shape) == {rank}, "the kernel was written for rank-{rank} inputs"
        assert {source}.numel() < 2**31, "offsets are 32-bit: inputs under 2**31 elements"
        n, c = shape[0], shape[1]
        spatial = {source}.numel() // max(n * c, 1)
        assert n * spatial > 0 and c > 0, "batch statistics need at least one value per channel"
{views}
{allocs}
        block_s = min(triton.next_power_of_2(spatial), {block})
        block_r = max(1, min(triton.next_power_of_2(n), {block} // block_s))
        s_tiles = triton.cdiv(spatial, block_s)
        tiles = triton.cdiv(n, block_r) * s_tiles
        device = {source}.device
        # The Triton interpreter runs on the CPU, where there are no SMs to count: one stands in.
        sms = (torch.cuda.get_device_properties(device).multi_processor_count
               if device.type == "cuda" else 1)
'''

_SPLIT_LAUNCH = '''        splits = max(1, min(tiles, triton.cdiv({programs_per_sm} * sms, c)))
        partial = torch.empty((3, c, splits), device=device, dtype=torch.float32)
        tiling = dict(N=n, SPATIAL=spatial, SPLITS=splits, BLOCK_R=block_r, BLOCK_S=block_s,
                      S_TILES=s_tiles, TILES=tiles, STEPS=triton.cdiv(tiles, splits),
                      num_warps={num_warps})
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

# Turn k of program p normalizes channel p + k × programs, so at most programs_per_sm × SMs
# channels are in flight. Between a channel's two loops the other channels in flight read
# theirs: to find the channel in L2 the second time, those must fit. On an H200 (132 SMs,
# 50 MiB of L2) one program per SM on 32 × 56² fp32 channels (400 KB) holds 53 MB: about the
# L2. So the statistics loop's loads ask L2 to keep their lines (evict_last), the normalizing
# loop walks the tiles backwards (the ones read last are the likeliest still there) and its
# loads and stores, never needed again, ask to go first.
_CHANNEL_KERNEL = '''
@triton.jit
def batch_norm_kernel(
{pointer_params}
{stride_params}
    N: tl.constexpr,
    C: tl.constexpr,
    SPATIAL: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_S: tl.constexpr,
    S_TILES: tl.constexpr,
    TILES: tl.constexpr,
    TURNS: tl.constexpr,
):
    # The programs take the channels in turns: few enough channels in flight to stay in L2
    # between each channel's statistics loop and its normalizing loop.
    for turn in range(TURNS):
        channel = tl.program_id(0) + turn * tl.num_programs(0)
        if channel < C:
{channel_loads}
            count = tl.zeros([BLOCK_R, BLOCK_S], tl.float32)
            mean = tl.zeros([BLOCK_R, BLOCK_S], tl.float32)
            m2 = tl.zeros([BLOCK_R, BLOCK_S], tl.float32)
            for t in range(TILES):
{tile}
{stat_loads}
{stat_prologue}
{welford}
            # Chan et al.: the channel's statistics from the lanes' (count, mean, M2) states.
            total = tl.sum(count)
            channel_mean = tl.sum(count * mean) / total
            spread = mean - channel_mean
            rstd = tl.rsqrt((tl.sum(m2) + tl.sum(count * spread * spread)) / total + {eps})
            # Backwards: the tiles read last are the likeliest still in L2.
            for step in range(TILES):
                t = TILES - 1 - step
{tile}
{loads}
{prologue}
                y = ({x} - channel_mean) * rstd{affine}
{epilogue}
                offsets = samples[:, None] * (C * SPATIAL) + channel * SPATIAL + positions[None, :]
{stores}
'''

_CHANNEL_LAUNCH = '''        programs = min(c, {programs_per_sm} * sms)
        batch_norm_kernel[(programs,)](
            {pointer_args},
            {stride_args}
            N=n,
            C=c,
            SPATIAL=spatial,
            BLOCK_R=block_r,
            BLOCK_S=block_s,
            S_TILES=s_tiles,
            TILES=tiles,
            TURNS=triton.cdiv(c, programs),
            num_warps={num_warps},
        )
        return {returns}
'''

_SPLIT_SOURCE = _MODULE_HEAD + _SPLIT_KERNELS + _FORWARD_HEAD + _SPLIT_LAUNCH
_CHANNEL_SOURCE = _MODULE_HEAD + _CHANNEL_KERNEL + _FORWARD_HEAD + _CHANNEL_LAUNCH


def _tile_loads(site: ChannelSite, needed: set[int], eviction: str = "") -> list[str]:
    """Loads of a [BLOCK_R samples, BLOCK_S positions] tile of one channel's full inputs."""
    hint = f", eviction_policy=\"{eviction}\"" if eviction else ""
    return [f"x{i} = tl.load(in{i}_ptr + samples[:, None] * in{i}_sn + channel * in{i}_sc + "
            f"positions[None, :] * in{i}_ss, mask=mask, other=0.0{hint}).to(tl.float32)"
            for i in sorted(needed) if i not in site.channel]


def _channel_loads(site: ChannelSite, needed: set[int]) -> list[str]:
    """The channel's one value of each per-channel input, loaded once per program."""
    return [f"x{i} = tl.load(in{i}_ptr + channel * in{i}_sc).to(tl.float32)"
            for i in sorted(needed) if i in site.channel]


def write_batch_norm(graph: SiteGraph, config: BatchNormConfig) -> str:
    """ModelNew for a site of one training-mode F.batch_norm without running statistics."""
    anchors = [op for op in graph.ops if op.name == "batch_norm"]
    if len(anchors) != 1:
        raise Unsupported("the batch-statistics kernel takes a site with one batch_norm")
    anchor = anchors[0]
    if not arg(anchor, "training", 5, False):
        raise Unsupported("batch_norm in inference mode is elementwise: the pointwise kernel's")
    if any(isinstance(arg(anchor, name, i), Ref)
           for i, name in ((1, "running_mean"), (2, "running_var"))):
        raise Unsupported("batch_norm that updates running statistics in place: a candidate "
                          "may not change its inputs")
    weight, bias = arg(anchor, "weight", 3), arg(anchor, "bias", 4)
    eps = arg(anchor, "eps", 7, 1e-5)
    if not isinstance(eps, float | int):
        raise Unsupported("batch_norm with a computed eps")
    site = channel_site(graph, "batch_norm", [weight, bias])
    r = site.anchor
    source = anchor.args[0]
    before = list(enumerate(graph.ops[:r]))
    after = list(enumerate(graph.ops[r + 1:], r + 1))
    stat_inputs = inputs_of(before) | ({source.index} if source.is_input else set())
    stat_used = sorted(stat_inputs)

    # Per-channel: the statistics loop keeps its lines in L2 for the normalizing loop, whose
    # loads and stores are the last use (see _CHANNEL_KERNEL).
    per_channel = config.one_program_per_channel
    value = {Ref(i, True): f"x{i}" for i in site.used}
    stat_loads = _tile_loads(site, stat_inputs, "evict_last" if per_channel else "")
    stat_prologue = elementwise_lines(before, dict(value))
    loads = _tile_loads(site, set(site.used), "evict_first" if per_channel else "")
    prologue = elementwise_lines(before, value)
    affine = (f" * {value[weight]}" if isinstance(weight, Ref) else "") + (
        f" + {value[bias]}" if isinstance(bias, Ref) else "")
    value[Ref(r, False)] = "y"
    epilogue = elementwise_lines(after, value)
    hint = ', eviction_policy="evict_first"' if per_channel else ""
    stores = [f"tl.store(out{k}_ptr + offsets, {value[ref]}.to({tl_dtype(graph.info(ref).dtype)}), "
              f"mask=mask{hint})" for k, ref in enumerate(graph.outputs)]
    stat_site = ChannelSite(r, site.shape, stat_used, site.full, site.channel)
    row_source = f"in{site.full[0]}"
    outs = [f"out{k}" for k in range(len(graph.outputs))]
    body = 16 if per_channel else 8  # the tile loops' depth
    fields = dict(
        ops=" → ".join(op.name for op in graph.ops),
        config=config.describe(),
        pointer_params=indent([f"in{i}_ptr," for i in site.used] + [f"{o}_ptr," for o in outs],
                              4),
        stride_params=indent(stride_params(site), 4),
        stat_loads=indent(stat_loads, body),
        stat_prologue=indent(stat_prologue, body),
        welford=indent(_WELFORD.format(x=value[source]).splitlines(), body),
        x=value[source],
        eps=repr(float(eps)),
        channel_loads=indent(_channel_loads(site, set(site.used)), body - 4),
        loads=indent(loads, body),
        prologue=indent(prologue, body),
        affine=affine,
        epilogue=indent(epilogue, body),
        stores=indent(stores, body),
        params=", ".join(f"in{i}" for i in range(len(graph.inputs))),
        source=row_source,
        rank=len(site.shape),
        views=indent(views(site), 8),
        allocs=indent([f"{o} = torch.empty(shape, device={row_source}.device, "
                       f"dtype={graph.info(ref).dtype})"
                       for o, ref in zip(outs, graph.outputs, strict=True)], 8),
        block=config.block,
        programs_per_sm=config.programs_per_sm,
        num_warps=config.num_warps,
        pointer_args=", ".join([f"x{i}" for i in site.used] + outs),
        stride_args=stride_args(site),
        returns=", ".join(outs),
    )
    if per_channel:
        return _CHANNEL_SOURCE.format(tile=indent(_CHANNEL_TILE.splitlines(), body), **fields)
    return _SPLIT_SOURCE.format(
        tile=indent(_TILE.splitlines(), body),
        stat_pointer_params=indent([f"in{i}_ptr," for i in stat_used], 4),
        stat_stride_params=indent(stride_params(stat_site), 4),
        stat_channel_loads=indent(_channel_loads(site, stat_inputs), 4),
        stat_pointer_args=", ".join(f"x{i}" for i in stat_site.used),
        stat_stride_args=stride_args(stat_site),
        **fields,
    )
