"""The roofline floor of a region: the fewest bytes it must move and the FLOPs it must do.

A kernel cannot beat max(bytes / bandwidth, FLOPs / peak). Bytes count each input read once
(a broadcast input only over the elements it really has) and each output written once.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
import torch.fx as fx

from core.runtime.ops import OpKind, op_info
from core.runtime.partition import Region


def _h200_matrix_peaks() -> dict[str, float]:
    # 8192^3 torch matmuls on an H200, random data, near the top of each measured range
    # (bench/NOTES.md, Ceilings); torch leaves tf32 off for fp32 matmuls.
    return {"bf16": 790e12, "fp16": 765e12, "fp32": 50.7e12}


@dataclass(frozen=True)
class GpuPeaks:
    """The ceilings a floor is computed against; defaults are an H200's."""

    name: str = "H200"
    bandwidth: float = 4.3e12  # bytes/s, device-to-device copy counting read + write
    matrix_flops: dict[str, float] = field(default_factory=_h200_matrix_peaks)
    vector_flops: float = 67e12  # plain fp32 arithmetic, the datasheet's figure
    sms: int = 132  # NVIDIA's Hopper datasheet, as the L2 below
    l2_bytes: int = 50 * 2**20

    def matrix_peak(self, dtype: torch.dtype) -> float:
        key = {torch.bfloat16: "bf16", torch.float16: "fp16"}.get(dtype, "fp32")
        return self.matrix_flops[key]


@dataclass(frozen=True)
class Cost:
    bytes: int
    matrix_flops: int  # on tensor cores (matmul, conv, attention)
    vector_flops: int  # everything else
    floor_ms: float


def _meta(node: object) -> torch.Tensor | None:
    value = node.meta.get("example_value") if isinstance(node, fx.Node) else None
    return value if isinstance(value, torch.Tensor) else None


def touched_bytes(t: torch.Tensor) -> int:
    """Bytes a kernel must read: broadcast (stride-0) dimensions count once."""
    elements = math.prod(size for size, stride in zip(t.shape, t.stride(), strict=True)
                         if stride != 0)
    return elements * t.element_size()


def _matrix_flops(node: fx.Node, name: str, out: torch.Tensor) -> int:
    args = [_meta(a) for a in node.args]
    first = args[0] if args else None
    if name in ("linear", "matmul", "mm", "bmm") and first is not None:
        return 2 * out.numel() * first.shape[-1]
    if name in ("addmm", "baddbmm", "addmv") and len(args) > 1 and args[1] is not None:
        return 2 * out.numel() * args[1].shape[-1]
    if name.startswith("conv_transpose") and first is not None and args[1] is not None:
        return 2 * first.numel() * math.prod(args[1].shape[1:])
    if name.startswith("conv") and len(args) > 1 and args[1] is not None:
        return 2 * out.numel() * math.prod(args[1].shape[1:])
    if name == "scaled_dot_product_attention" and len(args) > 2 and None not in args[:3]:
        query, key, value = args[:3]
        pairs = out.numel() // value.shape[-1] * key.shape[-2]
        return 2 * pairs * (query.shape[-1] + value.shape[-1])
    return 0


def region_cost(region: Region, peaks: GpuPeaks) -> Cost:
    inputs = [m for m in (_meta(n) for n in region.inputs) if m is not None]
    outputs = [m for m in (_meta(n) for n in region.outputs) if m is not None]
    moved = sum(touched_bytes(t) for t in inputs) + sum(t.numel() * t.element_size()
                                                       for t in outputs)
    matrix = vector = 0
    seconds = 0.0
    for node in region.nodes:
        out = _meta(node)
        if out is None:
            continue
        info = op_info(node)
        if info.kind in (OpKind.MATMUL, OpKind.CONV, OpKind.ATTENTION):
            flops = _matrix_flops(node, info.name, out)
            matrix += flops
            seconds += flops / peaks.matrix_peak(out.dtype)
        else:
            ins = [m for m in (_meta(a) for a in node.all_input_nodes) if m is not None]
            # Norms and softmax do a handful of operations per element read.
            per_element = 5 if info.kind is OpKind.REDUCTION else 1
            elements = max([out.numel(), *(t.numel() for t in ins)])
            vector += per_element * elements
    seconds += vector / peaks.vector_flops
    floor = max(moved / peaks.bandwidth, seconds)
    return Cost(moved, matrix, vector, floor * 1e3)
