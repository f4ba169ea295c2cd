"""How a matmul site's forward brings its anchor's operands to the kernel's
[batch, M, K] @ [batch, K, N], for every anchor: linear, mm, bmm, addmm, baddbmm and matmul, and
a convolution by a 1×1 kernel (each sample's positions times the weight's [out, in] matrix);
and how it follows the views of the values after it (each a shape-only stage tensor)."""

from __future__ import annotations

from dataclasses import dataclass

from generators.site_graph import Op, Ref, SiteGraph, Unsupported, constant_source

# Views that change shape but keep the element order; emitted as the same tensor method.
SHAPE_VIEWS = frozenset({"view", "reshape", "flatten", "unflatten", "unsqueeze", "squeeze"})
# Identities in inference: the value passes through unchanged.
IDENTITY_VIEWS = frozenset({"dropout", "alpha_dropout", "feature_alpha_dropout", "dropout1d",
                            "dropout2d", "dropout3d", "identity", "detach", "contiguous"})


def _size(value: object) -> str:
    return constant_source(value, "a view whose size is a tensor")


def viewed(op: Op, at: str) -> str:
    """Forward's expression of the shape-view `op` of the stage tensor `at`."""
    rest = [_size(a) for a in op.args[1:]] + [f"{k}={_size(v)}" for k, v in op.kwargs]
    return f"{at}.{op.name}({', '.join(rest)})"


def _arg(op: Op, position: int, key: str, default: object = None) -> object:
    return op.kwarg(key, op.args[position] if position < len(op.args) else default)


POINTWISE_CONVS = frozenset({"conv1d", "conv2d", "conv3d"})


def _each(value: object, wanted: int) -> bool:
    """Whether a convolution's setting (an int, or one a dimension) is `wanted` everywhere."""
    values = value if isinstance(value, tuple | list) else (value,)
    return all(type(v) is int and v == wanted for v in values)


def pointwise_conv(graph: SiteGraph, op: Op) -> bool:
    """Whether `op` convolves by a 1×1 kernel (1, or 1×1×1) with stride 1, no padding or
    dilation and one group: each output position is the weight's [out, in] matrix times the
    input's channels there, a matmul whose epilogue the tiles apply (cuDNN's convolution would
    write its output whole for a second kernel to read)."""
    if op.name not in POINTWISE_CONVS or len(op.args) < 2:
        return False
    weight = op.args[1]
    if not (isinstance(weight, Ref) and weight.is_input):
        return False
    padding = _arg(op, 4, "padding", 0)
    return (all(size == 1 for size in graph.inputs[weight.index].shape[2:])
            and _each(_arg(op, 3, "stride", 1), 1) and _each(_arg(op, 5, "dilation", 1), 1)
            and (padding in ("valid", "same") or _each(padding, 0))
            and _arg(op, 6, "groups", 1) == 1)


def is_anchor(graph: SiteGraph, op: Op) -> bool:
    """Whether `op` is one the matmul kernel computes: a matmul, or a 1×1 convolution."""
    return op.kind.value == "matmul" or pointwise_conv(graph, op)


@dataclass
class Anchor:
    """How forward brings the anchor's operands to [batch, M, K] @ [batch, K, N]."""

    prepare: list[str]  # forward lines defining `a`, `b` and `shape` (the anchor's output shape)
    bias: Ref | None
    alpha: object
    beta: object
    needs_broadcast: bool = False
    channel_bias: bool = False  # the bias varies along the output's dimension 1 (a conv's)


def prepare_operands(graph: SiteGraph, op: Op) -> Anchor:
    """The forward lines bringing the site's matmul `op` to the kernel's shapes, and its bias
    and scales for the epilogue."""
    if not op.args or not all(isinstance(r, Ref) and r.is_input for r in op.args[:2]):
        raise Unsupported(f"{op.name} of values the site computes itself")
    if op.name == "linear":
        x, w = op.args[0], op.args[1]
        bias = _arg(op, 2, "bias")
        return Anchor([f"a = {x.name}.reshape(-1, {x.name}.shape[-1]).unsqueeze(0)",
                       f"b = {w.name}.t().unsqueeze(0)",
                       f"shape = (*{x.name}.shape[:-1], {w.name}.shape[0])"], bias, 1, 1)
    if op.name in ("mm", "bmm"):
        x, y = op.args[0], op.args[1]
        if op.name == "mm":
            return Anchor([f"a = {x.name}.unsqueeze(0)", f"b = {y.name}.unsqueeze(0)",
                           f"shape = ({x.name}.shape[0], {y.name}.shape[1])"], None, 1, 1)
        return Anchor([f"a, b = {x.name}, {y.name}",
                       f"shape = ({x.name}.shape[0], {x.name}.shape[1], {y.name}.shape[2])"],
                      None, 1, 1)
    if op.name in ("addmm", "baddbmm"):
        if len(op.args) < 3 or not all(isinstance(r, Ref) and r.is_input for r in op.args[:3]):
            raise Unsupported(f"{op.name} of values the site computes itself")
        bias, x, y = op.args[:3]
        beta, alpha = _arg(op, 3, "beta", 1), _arg(op, 4, "alpha", 1)
        if op.name == "addmm":
            return Anchor([f"a = {x.name}.unsqueeze(0)", f"b = {y.name}.unsqueeze(0)",
                           f"shape = ({x.name}.shape[0], {y.name}.shape[1])"], bias, alpha, beta)
        return Anchor([f"a, b = {x.name}, {y.name}",
                       f"shape = ({x.name}.shape[0], {x.name}.shape[1], {y.name}.shape[2])"],
                      bias, alpha, beta)
    if op.name == "matmul":
        return _matmul_anchor(graph, op)
    if pointwise_conv(graph, op):
        x, w = op.args[0], op.args[1]
        # The weight's matrix shared by every sample (a batch stride of 0, nothing copied),
        # each sample's channels × positions as it lies (NCHW or channels-last alike).
        return Anchor([f"a = {w.name}.reshape({w.name}.shape[0], {w.name}.shape[1])"
                       f".expand({x.name}.shape[0], -1, -1)",
                       f"b = {x.name}.flatten(2)",
                       f"shape = ({x.name}.shape[0], {w.name}.shape[0], *{x.name}.shape[2:])"],
                      _arg(op, 2, "bias"), 1, 1, channel_bias=True)
    raise Unsupported(f"no matmul rule for {op.name}")


def _matmul_anchor(graph: SiteGraph, op: Op) -> Anchor:
    x, y = op.args[0], op.args[1]
    rank_x, rank_y = len(graph.info(x).shape), len(graph.info(y).shape)
    if rank_x < 2 or rank_y < 2:
        raise Unsupported("matmul with a vector operand")
    if rank_y == 2:
        # A stack of rows times one matrix: the leading dimensions fold into M.
        return Anchor([f"a = {x.name}.reshape(-1, {x.name}.shape[-1]).unsqueeze(0)",
                       f"b = {y.name}.unsqueeze(0)",
                       f"shape = (*{x.name}.shape[:-1], {y.name}.shape[-1])"], None, 1, 1)
    batch = f"_broadcast_shape([{x.name}.shape[:-2], {y.name}.shape[:-2]])"
    return Anchor([f"batch_shape = {batch}",
                   f"a = {x.name}.expand(*batch_shape, *{x.name}.shape[-2:])"
                   f".reshape(-1, *{x.name}.shape[-2:])",
                   f"b = {y.name}.expand(*batch_shape, *{y.name}.shape[-2:])"
                   f".reshape(-1, *{y.name}.shape[-2:])",
                   f"shape = (*batch_shape, {x.name}.shape[-2], {y.name}.shape[-1])"],
                  None, 1, 1, needs_broadcast=True)
