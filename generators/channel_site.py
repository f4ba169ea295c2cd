"""A site built around one group_norm, instance_norm or training-mode batch_norm over
(N, C, *spatial), as the Triton and CUDA channel-norm writers read it: which inputs have the full
shape, which hold one value per channel, and how the model reshapes them for a kernel. Instance
norm is group norm with a group a channel."""

from __future__ import annotations

from dataclasses import dataclass

from generators.codegen import arg, op_refs
from generators.site_graph import Op, Ref, SiteGraph, TensorInfo, Unsupported


@dataclass(frozen=True)
class ChannelSite:
    """A normalization over (N, C, *spatial) with its elementwise ops, as the writers read it.

    `full` inputs have the normalized input's shape; `channel` inputs hold one value per
    channel (C,) or (1, C, 1, ...), broadcast over the batch and the positions.
    """

    anchor: int  # index of the normalization op
    shape: tuple[int, ...]
    used: list[int]
    full: list[int]
    channel: list[int]


def is_per_channel(info: TensorInfo, shape: tuple[int, ...]) -> bool:
    """Whether `info` broadcasts to `shape` as one value per channel (dimension 1)."""
    padded = (1,) * (len(shape) - len(info.shape)) + info.shape
    return (len(info.shape) <= len(shape) and padded[1] == shape[1]
            and all(size == 1 for d, size in enumerate(padded) if d != 1))


def channel_site(graph: SiteGraph, name: str, params: list[object]) -> ChannelSite:
    """Check that the site is one `name` op on (N, C, *spatial) with elementwise neighbours.

    `params` are the op's per-channel parameters (weight, bias...), read per channel whatever
    their shape; every other input must have the full shape or broadcast per channel.
    """
    anchors = [i for i, op in enumerate(graph.ops) if op.kind.value == "reduction"]
    if len(anchors) != 1 or graph.ops[anchors[0]].name != name:
        raise Unsupported(f"the {name} kernel takes a site with one {name} and elementwise ops")
    r = anchors[0]
    source = graph.ops[r].args[0]
    if not isinstance(source, Ref):
        raise Unsupported(f"the {name} input is not a tensor")
    shape = graph.info(source).shape
    if len(shape) < 2:
        raise Unsupported(f"{name} of a rank-{len(shape)} tensor: it needs (N, C, ...)")
    for op in graph.ops[:r] + graph.ops[r + 1:]:
        if op.kind.value not in ("pointwise", "view") or op.out.shape != shape:
            raise Unsupported(f"{op.name} is not elementwise on the {name} input's shape")
    for ref in graph.outputs:
        if graph.info(ref).shape != shape:
            raise Unsupported(f"an output of shape {graph.info(ref).shape}, not {shape}")
    used = sorted({a.index for op in graph.ops for a in op_refs(op) if a.is_input})
    param_inputs = {p.index for p in params if isinstance(p, Ref)}
    if any(not p.is_input for p in params if isinstance(p, Ref)):
        raise Unsupported(f"{name} parameters computed inside the site")
    full, channel = [], []
    for index in used:
        info = graph.inputs[index]
        if not info.dtype.is_floating_point:
            raise Unsupported(f"input in{index} is {info.dtype}: the rules handle float")
        elsewhere = any(Ref(index, True) in op_refs(op) for i, op in enumerate(graph.ops)
                        if i != r)
        if index in param_inputs:
            if elsewhere:
                raise Unsupported(f"in{index} is both a {name} parameter and an elementwise "
                                  "operand")
            channel.append(index)
        elif info.shape == shape:
            full.append(index)
        elif is_per_channel(info, shape):
            channel.append(index)
        else:
            raise Unsupported(f"input in{index} of shape {info.shape} broadcasts to {shape} "
                              "other than per channel")
    if not full:
        raise Unsupported(f"no input has the {name} input's full shape")
    return ChannelSite(r, shape, used, full, channel)


@dataclass(frozen=True)
class ChannelNorm:
    """A site's one group_norm, instance_norm or training-mode batch_norm, as the writers read
    it."""

    op: Op
    weight: object  # the per-channel affine parameters: Refs, or None
    bias: object
    # Sets a sample splits into: the channels for instance norm; 0 for batch norm, whose sets
    # are whole channels over the batch.
    groups: int
    eps: float
    site: ChannelSite


def channel_norm(graph: SiteGraph, names: tuple[str, ...]) -> ChannelNorm:
    """The site's normalization among `names`, checked for what a kernel of it can compute."""
    found = [op for op in graph.ops if op.name in names]
    if len(found) != 1:
        raise Unsupported(f"the {' or '.join(names)} kernel takes a site with one of them")
    op = found[0]
    if op.name == "group_norm":
        weight, bias = arg(op, "weight", 2), arg(op, "bias", 3)
        groups, eps = arg(op, "num_groups", 1), arg(op, "eps", 4, 1e-5)
        if not isinstance(groups, int):
            raise Unsupported("group_norm with a computed group count")
    elif op.name == "instance_norm":
        if not arg(op, "use_input_stats", 5, True):
            raise Unsupported("instance_norm from running statistics is elementwise: the "
                              "pointwise kernel's")
        _no_running_statistics(op)
        weight, bias = arg(op, "weight", 3), arg(op, "bias", 4)
        groups, eps = None, arg(op, "eps", 7, 1e-5)
    else:
        if not arg(op, "training", 5, False):
            raise Unsupported("batch_norm in inference mode is elementwise: the pointwise "
                              "kernel's")
        _no_running_statistics(op)
        weight, bias = arg(op, "weight", 3), arg(op, "bias", 4)
        groups, eps = 0, arg(op, "eps", 7, 1e-5)
    if not isinstance(eps, float | int):
        raise Unsupported(f"{op.name} with a computed eps")
    site = channel_site(graph, op.name, [weight, bias])
    groups = site.shape[1] if groups is None else groups
    if groups and site.shape[1] % groups:
        raise Unsupported(f"{site.shape[1]} channels do not split into {groups} groups")
    return ChannelNorm(op, weight, bias, groups, float(eps), site)


def _no_running_statistics(op: Op) -> None:
    if any(isinstance(arg(op, name, i), Ref)
           for i, name in ((1, "running_mean"), (2, "running_var"))):
        raise Unsupported(f"{op.name} that updates running statistics in place: a candidate "
                          "may not change its inputs")


def inputs_of(ops: list[tuple[int, Op]]) -> set[int]:
    return {a.index for _, op in ops for a in op_refs(op) if a.is_input}


def statistics_inputs(graph: SiteGraph, anchor: int, source: Ref) -> set[int]:
    """The inputs the statistics pass reads: those of the ops before the anchor, and the
    normalized tensor itself when it is an input."""
    return inputs_of(list(enumerate(graph.ops[:anchor]))) | (
        {source.index} if source.is_input else set())


def stride_params(site: ChannelSite) -> list[str]:
    return [f"in{i}_sc," if i in site.channel else f"in{i}_sn, in{i}_sc, in{i}_ss,"
            for i in site.used]


def views(site: ChannelSite) -> list[str]:
    """Full inputs as (N, C, S) (a view wherever the spatial dimensions merge), the rest (C,)."""
    lines = []
    for i in site.used:
        if i in site.channel:
            lines += [f'assert in{i}.numel() == c, "in{i} holds one value per channel"',
                      f"x{i} = in{i}.reshape(c)"]
        else:
            lines.append(f"x{i} = in{i}.reshape(n, c, spatial)")
    return lines


def stride_args(site: ChannelSite) -> str:
    return "".join(f"x{i}.stride(0), " if i in site.channel else f"*x{i}.stride(), "
                   for i in site.used)
