"""Tier-1 Triton for `group_norm` and `instance_norm` sites (a group a channel), with the input's
elementwise prologue and epilogue.

The input (N, C, *spatial) is read as (N, C, S): one program per (sample, group) walks the
group's C/G channels × S positions in [BLOCK_C, BLOCK_S] tiles twice. The first walk folds the
prologue's values into per-lane Welford states (count, mean, M2) in fp32, merged at the end
(Chan et al.), which stays exact where a sum of squares would cancel; the second, in reverse
order so that the tiles read last are still in L2, applies the normalization, the per-channel
affine map and the epilogue, and stores. Inputs of the full shape are read through their
strides; per-channel inputs (the affine weight and bias, or a (C, 1, 1) operand of the
prologue) once per tile row. The group's extents are compile-time constants (each shape
compiles once).
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
from generators.site_graph import Op, Ref, SiteGraph
from generators.triton.expressions import elementwise, tl_dtype, with_jit_helpers


@dataclass(frozen=True)
class GroupNormConfig:
    block: int = 2048  # elements per tile: BLOCK_S positions × BLOCK_C channels
    num_warps: int = 4
    persistent: bool = False  # a grid of programs_per_sm per SM, each taking groups in turn
    programs_per_sm: int = 1

    def describe(self) -> str:
        schedule = (f"{self.programs_per_sm} persistent program(s) per SM taking (sample, "
                    "group)s in turn" if self.persistent else "one program per (sample, group)")
        return f"{schedule}, tiles of {self.block}, {self.num_warps} warps"


def tile_loads(site: ChannelSite, needed: set[int], batch: str, channels: str,
               channel_mask: str, eviction: str = "") -> list[str]:
    """Loads of a [BLOCK_C, BLOCK_S] tile at sample(s) `batch` and channel vector `channels`;
    the full inputs' with L2 eviction policy `eviction` where one is given."""
    policy = f", eviction_policy='{eviction}'" if eviction else ""
    lines = []
    for index in sorted(needed):
        if index in site.channel:
            lines.append(f"x{index} = tl.load(in{index}_ptr + {channels} * in{index}_sc, "
                         f"mask={channel_mask}, other=0.0).to(tl.float32)[:, None]")
        else:
            lines.append(f"x{index} = tl.load(in{index}_ptr + {batch} * in{index}_sn + "
                         f"{channels}[:, None] * in{index}_sc + positions[None, :] * "
                         f"in{index}_ss, mask=mask, other=0.0{policy}).to(tl.float32)")
    return lines


def elementwise_lines(ops: list[tuple[int, Op]], value: dict[Ref, str]) -> list[str]:
    lines = []
    for i, op in ops:
        lines.append(f"v{i} = {elementwise(op, value)}")
        value[Ref(i, False)] = f"v{i}"
    return lines


@dataclass(frozen=True)
class NormalizedOutput:
    """What follows the normalization in the kernel: the affine part applied to `y`, the
    elementwise ops after the anchor, and the stores of the site's outputs at `offsets`."""

    affine: str
    epilogue: list[str]
    stores: list[str]


def normalized_output(graph: SiteGraph, value: dict[Ref, str], weight: object, bias: object,
                      anchor: int, eviction: str = "") -> NormalizedOutput:
    """`value` names the anchor's result `y` from here on; stores take L2 eviction policy
    `eviction` where one is given."""
    policy = f", eviction_policy='{eviction}'" if eviction else ""
    affine = (f" * {value[weight]}" if isinstance(weight, Ref) else "") + (
        f" + {value[bias]}" if isinstance(bias, Ref) else "")
    value[Ref(anchor, False)] = "y"
    epilogue = elementwise_lines(list(enumerate(graph.ops[anchor + 1:], anchor + 1)), value)
    stores = [f"tl.store(out{k}_ptr + offsets, {value[ref]}.to({tl_dtype(graph.info(ref).dtype)}), "
              f"mask=mask{policy})" for k, ref in enumerate(graph.outputs)]
    return NormalizedOutput(affine, epilogue, stores)


_SOURCE = '''"""Kiln rules kernel (triton, group_norm): {ops}. {config}."""

import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def group_norm_kernel(
{pointer_params}
{stride_params}
    groups,
    total_groups,
    STEPS: tl.constexpr,
    GROUP_C: tl.constexpr,
    SPATIAL: tl.constexpr,
    BLOCK_C: tl.constexpr,
    BLOCK_S: tl.constexpr,
):
    # Program p takes (sample, group)s p, p + grid, ...: one each on a full grid; in turn on a
    # persistent one, whose few groups in flight stay in L2 between their two walks.
    for step in range(STEPS):
        work = tl.program_id(0) + step * tl.num_programs(0)
        live = work < total_groups
        sample = work // groups
        first = (work % groups) * GROUP_C
        group_norm_walks(
{walk_args}
            sample, first, live, groups, GROUP_C, SPATIAL, BLOCK_C, BLOCK_S)


@triton.jit
def group_norm_walks(
{pointer_params}
{stride_params}
    sample,
    first,
    live,
    groups,
    GROUP_C: tl.constexpr,
    SPATIAL: tl.constexpr,
    BLOCK_C: tl.constexpr,
    BLOCK_S: tl.constexpr,
):
    count = tl.zeros([BLOCK_C, BLOCK_S], tl.float32)
    mean = tl.zeros([BLOCK_C, BLOCK_S], tl.float32)
    m2 = tl.zeros([BLOCK_C, BLOCK_S], tl.float32)
    for c0 in range(0, GROUP_C, BLOCK_C):
        channel_mask = (c0 + tl.arange(0, BLOCK_C) < GROUP_C) & live
        channels = first + c0 + tl.arange(0, BLOCK_C)
        for s0 in range(0, SPATIAL, BLOCK_S):
            positions = s0 + tl.arange(0, BLOCK_S)
            mask = channel_mask[:, None] & (positions < SPATIAL)[None, :]
{stat_loads}
{stat_prologue}
            count += tl.where(mask, 1.0, 0.0)
            delta = tl.where(mask, {x} - mean, 0.0)
            mean += tl.fdiv(delta, tl.maximum(count, 1.0), ieee_rounding=False)
            m2 += tl.where(mask, delta * ({x} - mean), 0.0)
    total = tl.sum(count)
    group_mean = tl.sum(count * mean) / total
    spread = mean - group_mean
    rstd = tl.rsqrt((tl.sum(m2) + tl.sum(count * spread * spread)) / total + {eps})
    out_base = sample * groups * GROUP_C * SPATIAL
    # The second walk visits the tiles in reverse, so the ones read last, still in L2, come
    # first.
    for c_back in range(0, GROUP_C, BLOCK_C):
        c0 = (GROUP_C - 1) // BLOCK_C * BLOCK_C - c_back
        channel_mask = (c0 + tl.arange(0, BLOCK_C) < GROUP_C) & live
        channels = first + c0 + tl.arange(0, BLOCK_C)
        for s_back in range(0, SPATIAL, BLOCK_S):
            s0 = (SPATIAL - 1) // BLOCK_S * BLOCK_S - s_back
            positions = s0 + tl.arange(0, BLOCK_S)
            mask = channel_mask[:, None] & (positions < SPATIAL)[None, :]
{loads}
{prologue}
            y = ({x} - group_mean) * rstd{affine}
{epilogue}
            offsets = out_base + channels[:, None] * SPATIAL + positions[None, :]
{stores}


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, {params}):
        shape = {source}.shape
        assert len(shape) == {rank}, "the kernel was written for rank-{rank} inputs"
        n, c = shape[0], shape[1]
        assert c % {groups} == 0, "the channels must split into {groups} groups"
        spatial = {source}.numel() // max(n * c, 1)
{views}
{allocs}
        block_s = min(triton.next_power_of_2(spatial), {block})
        block_c = max(1, min(triton.next_power_of_2(c // {groups}), {block} // block_s))
        total_groups = n * {groups}
{grid}
        group_norm_kernel[(grid,)](
            {pointer_args},
            {stride_args}
            {groups},
            total_groups,
            STEPS=triton.cdiv(total_groups, grid),
            GROUP_C=c // {groups},
            SPATIAL=spatial,
            BLOCK_C=block_c,
            BLOCK_S=block_s,
            num_warps={num_warps},
        )
        return {returns}
'''


def _persistent_grid(source: str, programs_per_sm: int) -> list[str]:
    return [f"device = {source}.device", SM_COUNT_LINE,
            f"grid = max(1, min(total_groups, {programs_per_sm} * sms))"]


def write_group_norm(graph: SiteGraph, config: GroupNormConfig) -> str:
    """ModelNew for a site of one F.group_norm or F.instance_norm (batch statistics) with
    elementwise ops on its input's shape."""
    norm = channel_norm(graph, ("group_norm", "instance_norm"))
    site, anchor, groups, eps = norm.site, norm.op, norm.groups, norm.eps
    params = [norm.weight, norm.bias]
    r = site.anchor
    source = anchor.args[0]
    before = list(enumerate(graph.ops[:r]))
    value = {Ref(i, True): f"x{i}" for i in site.used}
    # The first walk's tiles are asked to stay in L2 for the second, whose reads and writes
    # are asked to leave first: a few percent for 4096-element tiles with 8 warps at
    # 16×512×64² fp32 on an H200, where batch norm's kernels gained nothing from the same
    # hints (bench/NOTES.md, fifth round, eviction hints).
    stat_loads = tile_loads(site, statistics_inputs(graph, r, source), "sample", "channels",
                            "channel_mask", "evict_last")
    stat_prologue = elementwise_lines(before, dict(value))
    loads = tile_loads(site, set(site.used), "sample", "channels", "channel_mask", "evict_first")
    prologue = elementwise_lines(before, value)
    output = normalized_output(graph, value, *params, r, "evict_first")
    row_source = f"in{site.full[0]}"
    return with_jit_helpers(_SOURCE.format(
        ops=" → ".join(op.name for op in graph.ops),
        config=config.describe(),
        pointer_params=indent([f"in{i}_ptr," for i in site.used]
                              + [f"out{k}_ptr," for k in range(len(graph.outputs))], 4),
        stride_params=indent(stride_params(site), 4),
        stat_loads=indent(stat_loads, 12),
        stat_prologue=indent(stat_prologue, 12),
        x=value[source],
        eps=repr(float(eps)),
        loads=indent(loads, 12),
        prologue=indent(prologue, 12),
        affine=output.affine,
        epilogue=indent(output.epilogue, 12),
        stores=indent(output.stores, 12),
        params=", ".join(f"in{i}" for i in range(len(graph.inputs))),
        source=row_source,
        rank=len(site.shape),
        groups=groups,
        views=indent(views(site), 8),
        allocs=indent([f"out{k} = torch.empty(shape, device={row_source}.device, "
                       f"dtype={graph.info(ref).dtype})" for k, ref in enumerate(graph.outputs)],
                      8),
        block=config.block,
        pointer_args=", ".join([f"x{i}" for i in site.used]
                               + [f"out{k}" for k in range(len(graph.outputs))]),
        stride_args=stride_args(site),
        num_warps=config.num_warps,
        grid=indent(_persistent_grid(row_source, config.programs_per_sm) if config.persistent
                    else ["grid = max(total_groups, 1)"], 8),
        walk_args=indent([f"in{i}_ptr," for i in site.used]
                         + [f"out{k}_ptr," for k in range(len(graph.outputs))]
                         + stride_params(site), 12),
        returns=", ".join(f"out{k}" for k in range(len(graph.outputs))),
    ))
