"""Normalizations a matmul's output tiles can finish alone: softmax, log-softmax, layer norm and
RMS norm over the output's columns, and group norm of a [rows, channels] output, where each
group of columns that is normalized together lies inside one tile.

A tile of the matmul kernel holds BLOCK_N whole columns of BLOCK_M rows. When the columns
normalized together (a segment: the row, or a group of a row) fit in a tile, and the tile's
columns split into whole segments, the kernel normalizes its tile in registers and stores the
result: the product itself is never written, nor read back by a norm kernel. Segments are
laid side by side in a tile, so their length is a power of two, or the whole row padded to one
(one segment a tile, the padding masked).

The partition (`core.runtime.partition`) reads these rules on graph nodes and the matmul writer
on site ops: both hand `tile_norm` an op's name, its input's shape and its arguments.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch

TILE_NORMS = ("softmax", "log_softmax", "layer_norm", "rms_norm", "group_norm")
# The widest segment a tile holds: 256 columns, with 128 rows a tile of 32K fp32 values, as
# large as the matmul drafts' largest tile (BLOCK_M 128 × BLOCK_N 256).
MAX_TILE_SEGMENT = 256


@dataclass(frozen=True)
class TileNorm:
    """A normalization the tiles finish: `segment` columns together, laid in tiles as blocks of
    `block` (a power of two: the segment, or the row padded); its weight and bias as the op
    names them (graph nodes or site values; None where it has none); its epsilon (None for the
    softmaxes)."""

    name: str
    segment: int
    block: int
    weight: object = None
    bias: object = None
    eps: float | None = None


def _arg(args: Sequence[object], kwargs: Mapping[str, object], position: int, key: str,
         default: object = None) -> object:
    if key in kwargs:
        return kwargs[key]
    return args[position] if len(args) > position else default


@dataclass(frozen=True)
class RowNormArguments:
    """A layer or RMS norm's arguments as PyTorch reads them: the normalized shape (None where
    it names none), weight, bias (None for RMS norm) and epsilon, its default filled in."""

    normalized: tuple[object, ...] | None
    weight: object
    bias: object
    eps: float


def row_norm_arguments(name: str, args: Sequence[object], kwargs: Mapping[str, object],
                       dtype: torch.dtype) -> RowNormArguments:
    """The arguments of `name(*args, **kwargs)`, a layer norm or an RMS norm of `dtype` values
    (RMS norm's default epsilon is its dtype's); read here for the tiles that finish a norm and
    for the matmul prologue that starts with one."""
    layer = name == "layer_norm"
    eps = _arg(args, kwargs, 4 if layer else 3, "eps")
    return RowNormArguments(
        normalized_shape(args, kwargs),
        _arg(args, kwargs, 2, "weight"), _arg(args, kwargs, 3, "bias") if layer else None,
        float(eps if eps is not None else 1e-5 if layer else torch.finfo(dtype).eps))


def normalized_shape(args: Sequence[object], kwargs: Mapping[str, object]
                     ) -> tuple[object, ...] | None:
    """The dimensions a layer or RMS norm normalizes (None when not given as sizes)."""
    normalized = _arg(args, kwargs, 1, "normalized_shape")
    normalized = (normalized,) if isinstance(normalized, int) else normalized
    return tuple(normalized) if isinstance(normalized, tuple | list) else None


def _power_of_two(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


def tile_norm(name: str, shape: Sequence[int], args: Sequence[object],
              kwargs: Mapping[str, object], dtype: torch.dtype) -> TileNorm | None:
    """The normalization `name(*args, **kwargs)` of a matmul output of `shape` and `dtype`, if
    its tiles can finish it; else None. `args[0]` is the normalized value."""
    if name not in TILE_NORMS or not shape:
        return None
    columns = int(shape[-1])
    if name in ("softmax", "log_softmax"):
        dim = _arg(args, kwargs, 1, "dim")
        cast = kwargs.get("dtype") is not None or any(isinstance(a, torch.dtype) for a in args)
        if not isinstance(dim, int) or dim % len(shape) != len(shape) - 1 or cast:
            return None
        norm = TileNorm(name, columns, columns)
    elif name in ("layer_norm", "rms_norm"):
        parsed = row_norm_arguments(name, args, kwargs, dtype)
        if parsed.normalized != (columns,):
            return None
        norm = TileNorm(name, columns, columns, parsed.weight, parsed.bias, parsed.eps)
    else:
        groups = _arg(args, kwargs, 1, "num_groups")
        if len(shape) != 2 or not isinstance(groups, int) or groups <= 0 or columns % groups:
            return None
        norm = TileNorm(name, columns // groups, columns // groups,
                        _arg(args, kwargs, 2, "weight"), _arg(args, kwargs, 3, "bias"),
                        float(_arg(args, kwargs, 4, "eps", 1e-5)))
    if not _power_of_two(norm.block):
        if norm.segment != columns:
            return None  # groups side by side must each fill a power of two
        norm = TileNorm(norm.name, norm.segment, 1 << (columns - 1).bit_length(), norm.weight,
                        norm.bias, norm.eps)
    return norm if norm.block <= MAX_TILE_SEGMENT else None
