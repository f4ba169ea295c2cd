"""Ops the compiler leaves to the vendor library: a convolution other than a depthwise one.

cuDNN's convolutions are hard to beat, and what follows them (a bias, a batch norm, activations,
a group norm, a sum) is where a site's kernels win. The convolution is called through torch in
the candidate's forward, before the kernels and without its bias, and its output is one more
input of the IR (`Input.call` says how the forward computes it). The bias becomes an add of the
kernels: torch would add it to the convolution's output in a pass of its own.
"""

from __future__ import annotations

import torch

from generators.compiler.ir import Elementwise, Input, Value, View
from generators.site_graph import Unsupported, constant_source

# The torch.nn.functional call of a convolution: (transposed, windowed dimensions) -> name.
_CALLS = {(False, 1): "conv1d", (False, 2): "conv2d", (False, 3): "conv3d",
          (True, 1): "conv_transpose1d", (True, 2): "conv_transpose2d",
          (True, 3): "conv_transpose3d"}


def is_depthwise(source: Value, weight: Value, transposed: bool, groups: int) -> bool:
    channels = source.shape[1]
    return not transposed and groups == channels and tuple(weight.shape[:2]) == (channels, 1)


def output_stride(shape: tuple[int, ...], operands: list[Input]) -> tuple[int, ...]:
    """The layout torch gives a convolution's output: channels-last where its input or weight is
    (as cuDNN's suggested memory format has it; tracing on meta tensors says contiguous), else
    contiguous."""
    layout = {4: torch.channels_last, 5: torch.channels_last_3d}.get(len(shape))
    for operand in operands[:2]:
        laid = torch.empty_strided(operand.shape, operand.stride, device="meta")
        if layout is not None and laid.is_contiguous(memory_format=layout) and not \
                laid.is_contiguous():
            return tuple(torch.empty(shape, device="meta", memory_format=layout).stride())
    return tuple(torch.empty(shape, device="meta").stride())


def _setting(value: object) -> str:
    return constant_source(value, "a convolution setting that is a tensor")


def convolution_call(source: Input, weight: Input, arguments: tuple) -> str:
    """The forward's expression of aten.convolution's `arguments` (stride, padding, dilation,
    transposed, output_padding, groups) without a bias, through torch.nn.functional."""
    stride, padding, dilation, transposed, output_padding, groups = arguments
    dims = len(weight.shape) - 2
    if (bool(transposed), dims) not in _CALLS:
        raise Unsupported(f"a convolution over {dims} dimensions")
    name = _CALLS[(bool(transposed), dims)]
    settings = ([stride, padding, output_padding, groups, dilation] if transposed
                else [stride, padding, dilation, groups])
    return (f"torch.nn.functional.{name}(in{source.index}, in{weight.index}, None, "
            + ", ".join(_setting(s) for s in settings) + ")")


class LibraryLowering:
    """The `lower_*` handler of a convolution, mixed into the compiler's lowering: a depthwise
    one as windows (`WindowLowering.depthwise_convolution`), any other through the library."""

    inputs: list[Input]

    def lower_convolution(self, node, shape, dtype) -> Value:
        source, weight, bias = (self.value(a) for a in node.args[:3])
        transposed, groups = node.args[6], node.args[8]
        if is_depthwise(source, weight, transposed, groups):
            return self.depthwise_convolution(node, shape, dtype)
        operands = [source, weight] + ([bias] if bias is not None else [])
        if not all(isinstance(v, Input) and not v.call for v in operands):
            raise Unsupported("a convolution of values the site computes itself (cuDNN takes "
                              "the site's own inputs)")
        out = Input(shape, dtype, index=len(self.inputs), stride=output_stride(shape, operands),
                    call=convolution_call(source, weight, tuple(node.args[3:9])))
        self.inputs.append(out)
        if bias is None:
            return out
        per_channel = View((shape[1],) + (1,) * (len(shape) - 2), bias.dtype, source=bias,
                           kind="reshape")
        return Elementwise(shape, dtype, op="add", args=(out, per_channel))
