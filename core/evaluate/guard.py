"""Watch one call of a candidate: what torch ops it ran, which kernels it launched, and whether it
wrote outside its buffers or left them unwritten.

While a `Guard` is active, every uninitialized allocation the candidate makes (`torch.empty` and
its relatives) is placed between guard bands inside a larger buffer and filled with a poison
pattern (a NaN payload for floats). Afterwards an element that still holds the poison was never
written, and a changed guard byte was written out of bounds. Kernel launches are counted by
wrapping Triton's and pycuda's launchers; torch ops run inside a launch (the Triton interpreter
copies arguments with torch) are not the candidate's own.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

GUARD_BYTES = 1024
GUARD_BYTE = 0xA5
# Bit patterns used as poison: NaNs with a payload a computation is unlikely to produce.
FLOAT_POISON = {
    torch.float64: (torch.int64, 0x7FF5A5A5A5A5A5A5),
    torch.float32: (torch.int32, 0x7FA5A5A5),
    torch.float16: (torch.int16, 0x7DA5),
    torch.bfloat16: (torch.int16, 0x7FA5),
}
BITS_VIEW = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}

EMPTY_OPS = frozenset(
    {"aten.empty", "aten.empty_strided", "aten.empty_like", "aten.new_empty",
     "aten.new_empty_strided"}
)
# Ops that allocate, fill, copy or re-view memory without computing the site's function.
LAYOUT_OPS = EMPTY_OPS | frozenset(
    {"aten.zeros", "aten.zeros_like", "aten.ones", "aten.ones_like", "aten.full",
     "aten.full_like", "aten.new_zeros", "aten.new_ones", "aten.new_full", "aten.fill_",
     "aten.zero_", "aten.view", "aten._unsafe_view", "aten.reshape", "aten._reshape_alias",
     "aten.as_strided", "aten.t", "aten.transpose", "aten.permute", "aten.expand",
     "aten.squeeze", "aten.unsqueeze", "aten.slice", "aten.select", "aten.split",
     "aten.unbind", "aten.clone", "aten.copy_", "aten._to_copy", "aten.detach", "aten.alias",
     "aten.lift_fresh", "aten.view_as", "aten.sym_size", "aten.sym_stride", "aten.sym_numel",
     "aten.is_contiguous", "aten._local_scalar_dense", "aten.set_", "aten.resize_"}
)
ANCHOR_OPS = {
    "aten.mm": "matmul", "aten.addmm": "matmul", "aten.bmm": "matmul", "aten.baddbmm": "matmul",
    "aten.convolution": "conv", "aten._convolution": "conv", "aten.cudnn_convolution": "conv",
    "aten.mkldnn_convolution": "conv", "aten.convolution_overrideable": "conv",
    "aten.cudnn_convolution_transpose": "conv", "aten.slow_conv_transpose2d": "conv",
    "aten.slow_conv3d_forward": "conv", "aten._slow_conv2d_forward": "conv",
}


class LaunchCounter:
    """Kernel launches since the last reset; torch ops inside a launch are not the candidate's."""

    def __init__(self) -> None:
        self.launches = 0
        self.depth = 0


COUNTER = LaunchCounter()


def _counting(method: Any, count: bool) -> Any:
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if count and COUNTER.depth == 0:
            COUNTER.launches += 1
        COUNTER.depth += 1
        try:
            return method(*args, **kwargs)
        finally:
            COUNTER.depth -= 1

    wrapper.kiln_counting = True  # type: ignore[attr-defined]
    return wrapper


def _wrap(cls: type, name: str, count: bool) -> None:
    method = getattr(cls, name, None)
    if method is not None and not getattr(method, "kiln_counting", False):
        setattr(cls, name, _counting(method, count))


def install_launch_counters() -> None:
    """Wrap Triton's launchers (and pycuda's, once imported); safe to call repeatedly."""
    import sys

    from triton.runtime import autotuner, interpreter, jit

    _wrap(jit.JITFunction, "run", count=True)
    _wrap(interpreter.InterpretedFunction, "run", count=True)
    _wrap(autotuner.Autotuner, "run", count=False)
    _wrap(autotuner.Heuristics, "run", count=False)
    if "pycuda.driver" in sys.modules:
        function = sys.modules["pycuda.driver"].Function
        for name in ("__call__", "prepared_call", "prepared_async_call", "prepared_timed_call"):
            _wrap(function, name, count=True)


@dataclass
class GuardedBuffer:
    backing: torch.Tensor
    data_bytes: int
    label: str

    def changed_guard_bytes(self) -> int:
        before = self.backing[:GUARD_BYTES]
        after = self.backing[GUARD_BYTES + self.data_bytes:]
        return int((before != GUARD_BYTE).sum() + (after != GUARD_BYTE).sum())


def poison(tensor: torch.Tensor) -> None:
    if tensor.dtype in FLOAT_POISON:
        bits, pattern = FLOAT_POISON[tensor.dtype]
        tensor.view(bits).fill_(pattern)
    else:
        tensor.view(torch.uint8).fill_(GUARD_BYTE)


def poison_mask(tensor: torch.Tensor) -> torch.Tensor:
    """True where an element holds exactly the poison bit pattern of its dtype.

    One-byte and complex dtypes have no pattern a kernel could not write: all False for them.
    """
    if tensor.dtype in FLOAT_POISON:
        bits, pattern = FLOAT_POISON[tensor.dtype]
        return tensor.contiguous().view(bits) == pattern
    bits = BITS_VIEW.get(tensor.element_size())
    if bits is None or tensor.element_size() == 1 or tensor.is_complex():
        return torch.zeros(tensor.shape, dtype=torch.bool, device=tensor.device)
    probe = torch.empty(1, dtype=tensor.dtype, device=tensor.device)
    probe.view(torch.uint8).fill_(GUARD_BYTE)
    return tensor.contiguous().view(bits) == probe.view(bits)


def guarded_like(template: torch.Tensor, label: str) -> tuple[torch.Tensor, GuardedBuffer]:
    """An uninitialized, poisoned tensor shaped like `template`, between guard bands."""
    data_bytes = template.untyped_storage().nbytes()
    backing = torch.full(
        (data_bytes + 2 * GUARD_BYTES,), GUARD_BYTE, dtype=torch.uint8, device=template.device
    )
    tensor = torch.empty(0, dtype=template.dtype, device=template.device)
    tensor.set_(backing.untyped_storage(), GUARD_BYTES // template.element_size(),
                template.shape, template.stride())
    poison(tensor)
    return tensor, GuardedBuffer(backing, data_bytes, label)


def guarded_copy(source: torch.Tensor, label: str) -> tuple[torch.Tensor, GuardedBuffer | None]:
    """A fresh copy of an input; contiguous inputs get guard bands around their storage."""
    if not source.is_contiguous() or source.numel() == 0:
        return source.clone(), None
    tensor, buffer = guarded_like(source, label)
    tensor.copy_(source)
    return tensor, buffer


class Guard(TorchDispatchMode):
    """Active around one candidate call: traces torch ops, poisons and guards allocations."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: Counter[str] = Counter()
        self.buffers: list[GuardedBuffer] = []
        self.launches_at_start = 0

    def __enter__(self) -> Guard:
        self.launches_at_start = COUNTER.launches
        return super().__enter__()

    @property
    def launches(self) -> int:
        return COUNTER.launches - self.launches_at_start

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        result = func(*args, **(kwargs or {}))
        if COUNTER.depth:
            return result
        name = str(func.overloadpacket)
        self.ops[name] += 1
        if name in EMPTY_OPS and isinstance(result, torch.Tensor) and result.numel() > 0:
            guarded, buffer = guarded_like(result, f"allocation {len(self.buffers)} ({name})")
            self.buffers.append(buffer)
            return guarded
        return result

    def compute_ops(self) -> list[str]:
        return sorted(op for op in self.ops if op not in LAYOUT_OPS and op not in ANCHOR_OPS)

    def library_ops(self) -> list[str]:
        return sorted(op for op in self.ops if op in ANCHOR_OPS)

    def out_of_bounds(self) -> list[str]:
        found = []
        for buffer in self.buffers:
            changed = buffer.changed_guard_bytes()
            if changed:
                found.append(f"{changed} guard bytes around {buffer.label} "
                             f"({buffer.data_bytes} bytes) were overwritten")
        return found
