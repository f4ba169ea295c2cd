"""Sliding windows in the compiler's IR: average and max pooling (adaptive ones too, where their
windows are even) and depthwise convolutions, each a window view of its input (`ir.Window`)
reduced over the window's offsets.

A window position in the padding reads the padding's value: zero for an average or a
convolution, -inf for a maximum. The view itself reads a valid element there (its coordinates
wrap around), and an elementwise `where` on the positions (`ir.Coordinate`) puts the padding's
value in its place, so no backend needs a masked load of its own for it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.fx as fx

from generators.compiler.ir import (
    Coordinate,
    Elementwise,
    Missing,
    Reduce,
    Value,
    View,
    Window,
)
from generators.site_graph import Unsupported


def argument(node: fx.Node, position: int, name: str, default: object = None) -> object:
    """An argument of the ATen `node` passed at `position` or by `name`, else `default`."""
    if len(node.args) > position:
        return node.args[position]
    return node.kwargs.get(name, default)


def _per_dim(value: object, count: int, default: int) -> tuple[int, ...]:
    """A pooling or convolution argument for each windowed dimension (an int or a list)."""
    if value is None or value == []:
        return (default,) * count
    listed = [value] if isinstance(value, int) else list(value)
    return tuple(listed * count if len(listed) == 1 else listed)


def windowed(source: Value, kernel: Sequence[int], stride: Sequence[int],
             padding: Sequence[int], dilation: Sequence[int], fill: float) -> Value:
    """The windows of `source` over its last len(kernel) dimensions, shaped (leading dims,
    positions, offsets), with `fill` where a window reaches into the padding."""
    w = len(kernel)
    lead = tuple(source.shape[:-w])
    sizes = source.shape[-w:]
    out = tuple((size + 2 * p - d * (k - 1) - 1) // s + 1
                for size, k, s, p, d in zip(sizes, kernel, stride, padding, dilation, strict=True))
    if any(o <= 0 for o in out):
        raise Unsupported(f"a window larger than its padded input ({tuple(sizes)})")
    if any(p >= size for p, size in zip(padding, sizes, strict=True)):
        # The view wraps a padded position once into the input: it must land inside it.
        raise Unsupported(f"padding {tuple(padding)} as wide as the input ({tuple(sizes)})")
    shape = lead + out + tuple(kernel)
    view = View(shape, source.dtype, source=source, kind="window",
                window=Window(tuple(stride), tuple(padding), tuple(dilation)))
    if not any(padding):
        return view
    inside: Value | None = None
    for i, (size, s, p, d) in enumerate(zip(sizes, stride, padding, dilation, strict=True)):
        position = Coordinate(shape, torch.int64, dims=(len(lead) + i, len(lead) + w + i),
                              scales=(s, d), offset=-p)
        low = Elementwise(shape, torch.bool, op="ge", args=(position, 0))
        high = Elementwise(shape, torch.bool, op="lt", args=(position, size))
        here = Elementwise(shape, torch.bool, op="logical_and", args=(low, high))
        inside = here if inside is None else Elementwise(shape, torch.bool, op="logical_and",
                                                         args=(inside, here))
    return Elementwise(shape, source.dtype, op="where", args=(inside, view, fill))


def _offsets(window: Value, count: int) -> tuple[int, ...]:
    return tuple(range(len(window.shape) - count, len(window.shape)))


class WindowLowering:
    """The `lower_*` handlers of windowed ATen ops, mixed into the compiler's lowering."""

    def pool_arguments(self, node, dims: int, dilated: bool) -> tuple[tuple[int, ...], ...]:
        """Kernel, stride, padding and dilation of an aten pooling `node` (`dilated`: a max
        pooling's signature, with a dilation before ceil_mode)."""
        kernel = _per_dim(argument(node, 1, "kernel_size"), dims, 1)
        stride = argument(node, 2, "stride")
        stride = _per_dim(stride, dims, 1) if stride not in (None, []) else kernel
        padding = _per_dim(argument(node, 3, "padding"), dims, 0)
        dilation = _per_dim(argument(node, 4, "dilation") if dilated else None, dims, 1)
        if argument(node, 5 if dilated else 4, "ceil_mode", False):
            raise Unsupported("pooling with ceil_mode (windows past the input's end)")
        return kernel, stride, padding, dilation

    def average_pool(self, node, shape, dtype, dims: int) -> Value:
        source = self.value(node.args[0])
        kernel, stride, padding, dilation = self.pool_arguments(node, dims, False)
        count_include_pad = argument(node, 5, "count_include_pad", True)
        override = argument(node, 6, "divisor_override")
        divisor = override or math.prod(kernel)
        if any(padding) and count_include_pad is False and not override:
            raise Unsupported("average pooling without the padding in its count")
        window = windowed(source, kernel, stride, padding, dilation, 0.0)
        total = Reduce(shape, dtype, source=window, kind="sum", dims=_offsets(window, dims))
        return Elementwise(shape, dtype, op="div", args=(total, float(divisor)))

    def lower_avg_pool2d(self, node, shape, dtype) -> Value:
        return self.average_pool(node, shape, dtype, 2)

    def lower_avg_pool3d(self, node, shape, dtype) -> Value:
        return self.average_pool(node, shape, dtype, 3)

    def max_pool(self, node, shape, dtype, dims: int) -> tuple[Value, Value]:
        source = self.value(node.args[0])
        window = windowed(source, *self.pool_arguments(node, dims, True), -math.inf)
        values = Reduce(shape, dtype, source=window, kind="amax", dims=_offsets(window, dims))
        return values, Missing(shape, torch.int64, why="the indices of a max pooling")

    def lower_max_pool2d_with_indices(self, node, shape, dtype) -> tuple[Value, Value]:
        return self.max_pool(node, tuple(node.meta["val"][0].shape), dtype, 2)

    def lower_max_pool3d_with_indices(self, node, shape, dtype) -> tuple[Value, Value]:
        return self.max_pool(node, tuple(node.meta["val"][0].shape), dtype, 3)

    def adaptive(self, node, shape, dtype, kind: str) -> Value:
        """An adaptive pooling whose output sizes divide the input's: even windows, a pooling
        with kernel and stride the ratio."""
        source = self.value(node.args[0])
        out = tuple(shape[len(shape) - len(node.args[1]):])
        sizes = tuple(source.shape[len(source.shape) - len(out):])
        if any(size % o for size, o in zip(sizes, out, strict=True)):
            raise Unsupported(f"adaptive pooling of {sizes} to {out}: uneven windows")
        ratio = tuple(size // o for size, o in zip(sizes, out, strict=True))
        fill = -math.inf if kind == "amax" else 0.0
        window = windowed(source, ratio, ratio, (0,) * len(out), (1,) * len(out), fill)
        return Reduce(shape, dtype, source=window, kind=kind, dims=_offsets(window, len(out)))

    def lower__adaptive_avg_pool2d(self, node, shape, dtype) -> Value:
        return self.adaptive(node, shape, dtype, "mean")

    lower__adaptive_avg_pool3d = lower__adaptive_avg_pool2d

    def lower_adaptive_max_pool2d(self, node, shape, dtype) -> tuple[Value, Value]:
        values = self.adaptive(node, tuple(node.meta["val"][0].shape), dtype, "amax")
        return values, Missing(values.shape, torch.int64, why="the indices of a max pooling")

    lower_adaptive_max_pool3d = lower_adaptive_max_pool2d

    def depthwise_convolution(self, node, shape, dtype) -> Value:
        """A depthwise convolution (each channel with its own filter) as its windows; the
        library takes the others (`generators.compiler.library`)."""
        source, weight, bias = (self.value(a) for a in node.args[:3])
        stride, padding, dilation = node.args[3:6]
        dims = len(weight.shape) - 2
        channels = source.shape[1]
        kernel = tuple(weight.shape[2:])
        window = windowed(source, kernel, _per_dim(stride, dims, 1), _per_dim(padding, dims, 0),
                          _per_dim(dilation, dims, 1), 0.0)
        filters = View((channels,) + (1,) * dims + kernel, weight.dtype, source=weight,
                       kind="reshape")
        products = Elementwise(window.shape, dtype, op="mul", args=(window, filters))
        out = Reduce(shape, dtype, source=products, kind="sum", dims=_offsets(products, dims))
        if bias is None:
            return out
        per_channel = View((channels,) + (1,) * dims, bias.dtype, source=bias, kind="reshape")
        return Elementwise(shape, dtype, op="add", args=(out, per_channel))
