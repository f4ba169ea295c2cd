"""The roofline floor of a region: the fewest bytes it must move and the FLOPs it must do.

A kernel cannot beat max(bytes / bandwidth, FLOPs / peak). Bytes count each input read once
(a broadcast input only over the elements it really has) and each output written once; reads
are bounded by the datasheet's bandwidth, writes by what a copy attains. One input is read
twice: one that a reduction folds in sets larger than the L2, when the reduction's result then
works on every element of that input again (a tensor divided by its whole norm): no kernel can
hold such a set on chip until its statistic is known.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

import torch
import torch.fx as fx

from core.runtime.ops import OpKind, op_info
from core.runtime.regions import Region


def _h200_matrix_peaks() -> dict[str, float]:
    # 8192^3 torch matmuls on an H200, random data, at the top of each measured range
    # (bench/NOTES.md, Ceilings). fp32 is the fastest way to fp32's accuracy on the tensor
    # cores: three TF32 products (tf32x3), a third of TF32's rate; plain fp32 arithmetic is
    # slower, so its rate would make a floor that tf32x3 kernels beat.
    return {"bf16": 798e12, "fp16": 766e12, "tf32": 403e12, "fp32": 403e12 / 3}


@dataclass(frozen=True)
class GpuPeaks:
    """The ceilings a floor is computed against; defaults are an H200's."""

    name: str = "H200"
    bandwidth: float = 4.3e12  # bytes/s, device-to-device copy counting read + write
    matrix_flops: dict[str, float] = field(default_factory=_h200_matrix_peaks)
    vector_flops: float = 67e12  # plain fp32 arithmetic, the datasheet's figure
    sms: int = 132  # NVIDIA's Hopper datasheet, as the L2 below
    l2_bytes: int = 50 * 2**20
    # Reads alone go faster than a copy's mix of reads and writes (a read-only MSELoss beat
    # the copy figure, bench/NOTES.md, the roofline): they are bounded by the datasheet's
    # HBM3e bandwidth, which nothing exceeds.
    read_bandwidth: float = 4.8e12
    # Read from the GPU the run is on (`core.profile.gpu_peaks`), not given: a resumed run reads
    # them again from the GPU it resumes on.
    detected: bool = False

    def with_bandwidth(self, bandwidth: float, name: str = "custom GPU") -> GpuPeaks:
        """These ceilings on a GPU known by its memory bandwidth (bytes/s): reads are bounded
        by that figure too."""
        return replace(self, name=name, bandwidth=bandwidth, read_bandwidth=bandwidth)

    def matrix_peak(self, dtype: torch.dtype, tf32: bool = False) -> float:
        """Matrix FLOP/s for `dtype`; fp32 at TF32's rate when its products may be TF32."""
        key = {torch.bfloat16: "bf16", torch.float16: "fp16"}.get(dtype, "fp32")
        if key == "fp32" and tf32:
            key = "tf32"
        return self.matrix_flops.get(key, self.matrix_flops["fp32"])

    def bytes_seconds(self, read: int, written: int) -> float:
        """The fewest seconds in which `read` bytes can be read and `written` bytes written."""
        return read / self.read_bandwidth + written / self.bandwidth

    def impossible_seconds(self, read: int, written: int) -> float:
        """Seconds no kernel can beat, however it is timed: its reads at the datasheet's
        bandwidth, and only the writes that overflow the L2 (writes it holds may drain after
        the kernel ends)."""
        return (read + max(0, written - self.l2_bytes)) / self.read_bandwidth


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


def _read_again(region: Region, peaks: GpuPeaks) -> list[fx.Node]:
    """The region's inputs read a second time (see the module's docstring)."""
    inside = set(region.nodes)
    sources: dict[fx.Node, set[fx.Node]] = {}  # the region's inputs a node depends on
    upstream: dict[fx.Node, set[fx.Node]] = {}  # the region's nodes a node depends on
    for node in region.nodes:
        sources[node], upstream[node] = set(), set()
        for parent in node.all_input_nodes:
            if parent in inside:
                sources[node] |= sources[parent]
                upstream[node] |= upstream[parent] | {parent}
            else:
                sources[node].add(parent)

    def numel(node: fx.Node) -> int:
        meta = _meta(node)
        return 0 if meta is None else meta.numel()

    again: set[fx.Node] = set()
    for node in region.nodes:
        folded = [t for t in (_meta(a) for a in node.all_input_nodes) if t is not None]
        if op_info(node).kind is not OpKind.REDUCTION or not folded or _meta(node) is None:
            continue
        source = max(folded, key=lambda t: t.numel())
        sets = max(1, numel(node))
        if sets >= source.numel() or source.numel() // sets * source.element_size() \
                <= peaks.l2_bytes:
            continue
        if any(node in upstream[user] and numel(user) >= source.numel()
               for user in region.nodes):
            again |= {i for i in sources[node] if numel(i) >= source.numel()}
    return [n for n in region.inputs if n in again]


def region_cost(region: Region, peaks: GpuPeaks, allow_tf32: bool = False) -> Cost:
    """The region's floor. fp32 convolutions run at TF32's rate (cuDNN's default, which the
    baseline uses), fp32 matmuls too when the run allows TF32 (`core.timing.precision`)."""
    inputs = [m for m in (_meta(n) for n in region.inputs) if m is not None]
    outputs = [m for m in (_meta(n) for n in region.outputs) if m is not None]
    read = sum(touched_bytes(t) for t in inputs)
    read += sum(touched_bytes(m) for m in (_meta(n) for n in _read_again(region, peaks))
                if m is not None)
    written = sum(t.numel() * t.element_size() for t in outputs)
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
            tf32 = info.kind is OpKind.CONV or allow_tf32
            seconds += flops / peaks.matrix_peak(out.dtype, tf32)
        else:
            ins = [m for m in (_meta(a) for a in node.all_input_nodes) if m is not None]
            # Norms and softmax do a handful of operations per element read.
            per_element = 5 if info.kind is OpKind.REDUCTION else 1
            elements = max([out.numel(), *(t.numel() for t in ins)])
            vector += per_element * elements
    seconds += vector / peaks.vector_flops
    floor = max(peaks.bytes_seconds(read, written), seconds)
    return Cost(read + written, matrix, vector, floor * 1e3)
