"""Ops the compiler leaves to the vendor library: a convolution other than a depthwise one.

cuDNN's convolutions are hard to beat, and what follows them (a bias, a batch norm, activations,
a group norm, a sum) is where a site's kernels win. The convolution is called through torch in
the candidate's forward, before the kernels and without its bias, and its output is one more
input of the IR (`Input.call` says how the forward computes it). The bias becomes an add of the
kernels: torch would add it to the convolution's output in a pass of its own.

Where the schedule asks for it (`Schedule.library_layout`), the convolution takes its input
channels-last, whatever layout the site was given: cuDNN's NHWC kernels ran every convolution of
the development set's level 2 in 0.58-0.73 of its NCHW time, the input's conversion included
for most (bench/NOTES.md, 2026-12-07, 12:47-). Its output is then channels-last too, which the
kernels after it read along its channels. Or the schedule asks for Kiln's own convolution
("gemm", an implicit GEMM in Triton: `generators.triton.conv_gemm`), its output contiguous.
"""

from __future__ import annotations

import torch

from generators.compiler.ir import Elementwise, Input, Value, View
from generators.site_graph import Unsupported, constant_source

# How a site's convolution is computed: cuDNN on its input as laid out, cuDNN on channels-last
# input, or Kiln's implicit GEMM (Triton candidates only).
CONVOLUTIONS = ("", "channels_last", "gemm")
_CHANNELS_LAST = {4: torch.channels_last, 5: torch.channels_last_3d}  # by rank
# The torch.nn.functional call of a convolution: (transposed, windowed dimensions) -> name.
_CALLS = {(False, 1): "conv1d", (False, 2): "conv2d", (False, 3): "conv3d",
          (True, 1): "conv_transpose1d", (True, 2): "conv_transpose2d",
          (True, 3): "conv_transpose3d"}


def is_depthwise(source: Value, weight: Value, transposed: bool, groups: int) -> bool:
    channels = source.shape[1]
    return not transposed and groups == channels and tuple(weight.shape[:2]) == (channels, 1)


def output_stride(shape: tuple[int, ...], operands: list[Input], layout: str = ""
                  ) -> tuple[int, ...]:
    """The layout torch gives a convolution's output: channels-last where the call converts its
    input to it (`layout`) or where its input or weight is (as cuDNN's suggested memory format
    has it; tracing on meta tensors says contiguous), else contiguous."""
    if layout == "gemm":
        return tuple(torch.empty(shape, device="meta").stride())
    memory_format = channels_last(len(shape)) if layout else _CHANNELS_LAST.get(len(shape))
    laid = [torch.empty_strided(o.shape, o.stride, device="meta") for o in operands[:2]]
    if memory_format is not None and (layout or any(
            t.is_contiguous(memory_format=memory_format) and not t.is_contiguous()
            for t in laid)):
        return tuple(torch.empty(shape, device="meta", memory_format=memory_format).stride())
    return tuple(torch.empty(shape, device="meta").stride())


def _setting(value: object) -> str:
    return constant_source(value, "a convolution setting that is a tensor")


def channels_last(rank: int) -> torch.memory_format:
    if rank not in _CHANNELS_LAST:
        raise Unsupported(f"a channels-last layout for a convolution of rank {rank}")
    return _CHANNELS_LAST[rank]


def convolution_call(source: Input, weight: Input, arguments: tuple, layout: str = "") -> str:
    """The forward's expression of aten.convolution's `arguments` (stride, padding, dilation,
    transposed, output_padding, groups) without a bias, through torch.nn.functional; with
    `layout`, its input converted to that layout first (a no-op where it already is)."""
    stride, padding, dilation, transposed, output_padding, groups = arguments
    dims = len(weight.shape) - 2
    if (bool(transposed), dims) not in _CALLS:
        raise Unsupported(f"a convolution over {dims} dimensions")
    if layout == "gemm":
        if transposed or groups != 1:
            raise Unsupported("Kiln's own convolution of a transposed or grouped one (cuDNN's)")
        if source.dtype not in (torch.float32, torch.float16, torch.bfloat16):
            raise Unsupported(f"Kiln's own convolution of {source.dtype}: it takes floats")
        settings = ", ".join(_setting(s) for s in (stride, padding, dilation))
        # `_convolve` is defined beside the kernels (`generators.triton.conv_gemm`).
        return f"_convolve(in{source.index}, in{weight.index}, {settings})"
    name = _CALLS[(bool(transposed), dims)]
    settings = ([stride, padding, output_padding, groups, dilation] if transposed
                else [stride, padding, dilation, groups])
    given = f"in{source.index}"
    if layout == "channels_last":
        given += f".contiguous(memory_format={channels_last(len(source.shape))})"
    return (f"torch.nn.functional.{name}({given}, in{weight.index}, None, "
            + ", ".join(_setting(s) for s in settings) + ")")


class LibraryLowering:
    """The `lower_*` handler of a convolution, mixed into the compiler's lowering: a depthwise
    one as windows (`WindowLowering.depthwise_convolution`), any other through the library."""

    inputs: list[Input]
    library_layout: str

    def lower_convolution(self, node, shape, dtype) -> Value:
        source, weight, bias = (self.value(a) for a in node.args[:3])
        transposed, groups = node.args[6], node.args[8]
        if is_depthwise(source, weight, transposed, groups):
            return self.depthwise_convolution(node, shape, dtype)
        operands = [source, weight] + ([bias] if bias is not None else [])
        if not all(isinstance(v, Input) and not v.call for v in operands):
            raise Unsupported("a convolution of values the site computes itself (cuDNN takes "
                              "the site's own inputs)")
        layout = self.library_layout
        out = Input(shape, dtype, index=len(self.inputs),
                    stride=output_stride(shape, operands, layout),
                    call=convolution_call(source, weight, tuple(node.args[3:9]), layout))
        self.inputs.append(out)
        if bias is None:
            return out
        per_channel = View((shape[1],) + (1,) * (len(shape) - 2), bias.dtype, source=bias,
                           kind="reshape")
        return Elementwise(shape, dtype, op="add", args=(out, per_channel))
