"""Tier-1 Triton for `conv` sites: the vendor convolution, then its whole epilogue in one pass.

cuDNN's convolution is hard to beat, so the candidate keeps it (through torch, the site's
anchor op) and runs without its bias. Everything after it (the bias, inference batch norm,
activations, scaling, residual adds) becomes one pointwise kernel over the conv's output,
written by the pointwise generator from an epilogue graph that takes the conv output as its
first input. The bias is one more broadcast input, viewed as [1, C, 1, ...] so it lines up
with the channels.

The pass runs in channel rows: the pointwise kernel views the output as rows × columns from the
real layouts, and for a contiguous NCHW conv output with per-channel (bias, batch-norm) and
full-shape (residual) inputs that view is one row per (image, channel) of H·W contiguous
elements. Each program takes a tile of such rows (several rows when the maps are small, part of
a row when they are large), loads every per-channel parameter once per row and reads the rest
linearly. Any other layout (a channels-last conv output, an input broadcast over the spatial
dims) gets the split its strides allow, down to the general strided walk, so every layout stays
right. The tile's size and warps are the `PointwiseConfig` knobs, which mutations move.
"""

from __future__ import annotations

from core.runtime.ops import OpKind
from generators.site_graph import (
    Op,
    Ref,
    SiteGraph,
    TensorInfo,
    Unsupported,
    constant_source,
)
from generators.triton.pointwise import PointwiseConfig, write_pointwise

_TITLE = "Kiln rules kernel (triton, conv epilogue): {ops}. {config}."

_MODEL = '''

class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.epilogue = ConvEpilogue()

    def forward(self, {params}):
        conv = torch.nn.functional.{conv}({conv_args})
        return self.epilogue({epilogue_args})
'''


def _setting(value: object) -> str:
    return constant_source(value, "a convolution setting that is a tensor")


def _remap(value: object, mapping: dict[Ref, Ref]) -> object:
    if isinstance(value, Ref):
        return mapping[value]
    if isinstance(value, tuple):
        return tuple(_remap(v, mapping) for v in value)
    return value


def _conv_call(conv: Op) -> tuple[str, Ref | None]:
    """The arguments of the bias-free conv call, and the bias it leaves to the epilogue."""
    x, w = conv.args[0], conv.args[1]
    bias = conv.kwarg("bias", conv.args[2] if len(conv.args) > 2 else None)
    if bias is not None and not (isinstance(bias, Ref) and bias.is_input):
        raise Unsupported("a conv bias the site computes itself")
    args = [x.name, w.name] + ["None"] * (len(conv.args) > 2)
    args += [_setting(a) for a in conv.args[3:]]
    args += [f"{key}={'None' if key == 'bias' else _setting(v)}" for key, v in conv.kwargs]
    return ", ".join(args), bias


def epilogue_graph(graph: SiteGraph) -> tuple[SiteGraph, Ref | None]:
    """The site after its conv, as a pointwise graph whose input 0 is the conv's output.

    With a bias, input 1 is the bias viewed as [1, C, 1, ...] and op 0 adds it; the site's own
    inputs follow.
    """
    conv = graph.ops[0]
    _, bias = _conv_call(conv)
    shift = 2 if bias is not None else 1
    mapping = {Ref(i, True): Ref(i + shift, True) for i in range(len(graph.inputs))}
    inputs = [conv.out]
    ops: list[Op] = []
    if bias is not None:
        channels = conv.out.shape[1]
        rank = len(conv.out.shape)
        inputs.append(TensorInfo((1, channels) + (1,) * (rank - 2), (1,) * rank,
                                 graph.inputs[bias.index].dtype))
        ops.append(Op("add", OpKind.POINTWISE, (Ref(0, True), Ref(1, True)), (),
                      conv.out))
        mapping[Ref(0, False)] = Ref(0, False)
    else:
        mapping[Ref(0, False)] = Ref(0, True)
    for i, op in enumerate(graph.ops[1:], start=1):
        if op.out.shape != conv.out.shape:
            raise Unsupported(f"{op.name} changes the conv output's shape")
        if op.kind.value not in ("pointwise", "view"):
            raise Unsupported(f"{op.name} is not elementwise")
        mapping[Ref(i, False)] = Ref(len(ops), False)
        ops.append(Op(op.name, op.kind, _remap(op.args, mapping),
                      tuple((k, _remap(v, mapping)) for k, v in op.kwargs), op.out))
    if not ops:
        raise Unsupported("a conv with no epilogue leaves a kernel nothing to do")
    outputs = tuple(mapping[r] for r in graph.outputs)
    if any(r.is_input for r in outputs):
        raise Unsupported("the site returns the conv's own output: nothing to fuse it with")
    return SiteGraph("pointwise", tuple(inputs) + graph.inputs, tuple(ops), outputs,
                     graph.returns_tuple), bias


def write_conv_epilogue(graph: SiteGraph, config: PointwiseConfig) -> str:
    """The ModelNew source: torch's conv without bias, then one Triton pass for the rest."""
    if graph.family != "conv" or not graph.ops or graph.ops[0].kind.value != "conv":
        raise Unsupported("the site does not start with a convolution")
    conv = graph.ops[0]
    if len(conv.args) < 2 or not all(isinstance(r, Ref) and r.is_input for r in conv.args[:2]):
        raise Unsupported(f"{conv.name} of values the site computes itself")
    conv_args, bias = _conv_call(conv)
    epilogue, _ = epilogue_graph(graph)
    names = [op.name for op in graph.ops]
    title = _TITLE.format(ops=f"{names[0]} (torch, no bias) → " + " → ".join(
        (["bias"] if bias is not None else []) + names[1:]), config=config.describe())
    pointwise = write_pointwise(epilogue, config, class_name="ConvEpilogue", title=title)
    params = [f"in{i}" for i in range(len(graph.inputs))]
    rank = len(conv.out.shape)
    bias_view = ([f"in{bias.index}.reshape(1, -1{', 1' * (rank - 2)})"]
                 if bias is not None else [])
    return pointwise + _MODEL.format(
        params=", ".join(params), conv=conv.name, conv_args=conv_args,
        epilogue_args=", ".join(["conv", *bias_view, *params]))
