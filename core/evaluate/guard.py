"""Watch one call of a candidate: what torch ops it ran, which kernels it launched, and whether it
wrote outside its buffers or left them unwritten.

While a `Guard` is active, every uninitialized allocation the candidate makes (`torch.empty` and
its relatives) is placed in a guarded buffer (`GuardedBuffer`) and filled with a poison pattern (a
NaN payload for floats). Afterwards an element that still holds the poison was never written, and
a changed guard byte was written out of bounds. The bands are sized to the data (`band_bytes`).
On the CPU a buffer is shared memory (`core.evaluate.transport.Region`) mapped between
inaccessible pages, so a write beyond a band faults.

Kernel launches are counted by wrapping Triton's and pycuda's launchers, and the launches
`core.runtime.cuda` makes through the CUDA driver itself. A torch op that runs
during a launch (in a grid callable, a heuristic, a pre-run hook) is recorded apart: the
interpreter's own argument copies are layout ops; anything else there is torch compute.

Buffers can be made before a call (`Guard.prepare`) from the allocations of the call before, so
that a timed call takes ready buffers instead of filling new ones inside the timed region: every
call, checked or timed, gets the same kind of buffers by the same path.
"""

from __future__ import annotations

import sys
from collections import Counter
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from core.evaluate.transport import PAGE, Region, new_region, raw_bytes
from core.runtime.problem_loader import storage_span

GUARD_BYTE = 0xA5
# Bands are sized to the data within these bounds; on the CPU inaccessible pages lie beyond.
MIN_BAND_BYTES = 128 << 10
MAX_BAND_BYTES = {"cpu": 1 << 20, "cuda": 16 << 20}
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
     "aten.is_contiguous", "aten.set_", "aten.resize_"}
)
ANCHOR_OPS = {
    "aten.mm": "matmul", "aten.addmm": "matmul", "aten.bmm": "matmul", "aten.baddbmm": "matmul",
    "aten.convolution": "conv", "aten._convolution": "conv", "aten.cudnn_convolution": "conv",
    "aten.mkldnn_convolution": "conv", "aten.convolution_overrideable": "conv",
    "aten.cudnn_convolution_transpose": "conv", "aten.slow_conv_transpose2d": "conv",
    "aten.slow_conv3d_forward": "conv", "aten._slow_conv2d_forward": "conv",
}


class LaunchCounter:
    """Kernel launches since the last reset; how deep inside a launcher (an autotuner, a
    heuristic, a kernel's own launch) the current code is, and inside how many launches."""

    def __init__(self) -> None:
        self.launches = 0
        self.depth = 0
        self.launching = 0


COUNTER = LaunchCounter()


def _counting(method: Any, count: bool) -> Any:
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if count and COUNTER.launching == 0:
            COUNTER.launches += 1
        COUNTER.depth += 1
        COUNTER.launching += count
        try:
            return method(*args, **kwargs)
        finally:
            COUNTER.depth -= 1
            COUNTER.launching -= count

    wrapper.kiln_counting = True  # type: ignore[attr-defined]
    return wrapper


def _wrap(cls: type, name: str, count: bool) -> None:
    method = getattr(cls, name, None)
    if method is not None and not getattr(method, "kiln_counting", False):
        setattr(cls, name, _counting(method, count))


def install_launch_counters() -> None:
    """Wrap Triton's launchers (and pycuda's, and the launches `core.runtime.cuda` makes
    through the CUDA driver, once imported); safe to call repeatedly."""
    from triton.runtime import autotuner, interpreter, jit

    _wrap(jit.JITFunction, "run", count=True)
    _wrap(interpreter.InterpretedFunction, "run", count=True)
    _wrap(autotuner.Autotuner, "run", count=False)
    _wrap(autotuner.Heuristics, "run", count=False)
    if "pycuda.driver" in sys.modules:
        function = sys.modules["pycuda.driver"].Function
        for name in ("__call__", "prepared_call", "prepared_async_call", "prepared_timed_call"):
            _wrap(function, name, count=True)
    if "core.runtime.cuda" in sys.modules:  # kernels launched through libcuda, not pycuda
        _wrap(sys.modules["core.runtime.cuda"].DriverKernel, "launch", count=True)


def band_bytes(data_bytes: int, device: torch.device) -> int:
    """A buffer's band on each side: the data's size, within MIN/MAX_BAND_BYTES."""
    rounded = -(-data_bytes // PAGE) * PAGE
    return max(MIN_BAND_BYTES, min(MAX_BAND_BYTES.get(device.type, MIN_BAND_BYTES), rounded))


@dataclass
class GuardedBuffer:
    """Bytes holding guard bands around `data_bytes` of data at `data_start`; on the CPU the
    shared `region` they live in."""

    backing: torch.Tensor
    data_start: int
    data_bytes: int
    label: str
    region: Region | None = None

    def changed_guard_bytes(self) -> int:
        bands = (self.backing[:self.data_start], self.backing[self.data_start + self.data_bytes:])
        return sum(0 if torch.equal(band, _pattern(band)) else int((band != GUARD_BYTE).sum())
                   for band in bands)

    def view(self, dtype: torch.dtype, shape: tuple[int, ...] | torch.Size,
             stride: tuple[int, ...]) -> torch.Tensor:
        """The data as a tensor of `dtype` with this shape and these strides."""
        size = torch.empty((), dtype=dtype).element_size()
        tensor = torch.empty(0, dtype=dtype, device=self.backing.device)
        tensor.set_(self.backing.untyped_storage(), self.data_start // size, shape, stride)
        return tensor


_PATTERNS: dict[torch.device, torch.Tensor] = {}


def _pattern(band: torch.Tensor) -> torch.Tensor:
    """GUARD_BYTE repeated as long as `band`, on its device (one buffer per device, grown as
    needed: comparing with it is a memcmp, where counting differences allocates)."""
    pattern = _PATTERNS.get(band.device)
    if pattern is None or pattern.numel() < band.numel():
        pattern = torch.full((max(band.numel(), 1 << 20),), GUARD_BYTE, dtype=torch.uint8,
                             device=band.device)
        _PATTERNS[band.device] = pattern
    return pattern[:band.numel()]


def guarded_buffer(data_bytes: int, device: torch.device, label: str,
                   lead: int = 0) -> GuardedBuffer:
    """Fresh guarded bytes for `data_bytes` of data, the bands filled with GUARD_BYTE; `lead`
    (a multiple of the page) more bytes of band below the data, so that memory just freed and
    handed out again holds the data at another address."""
    band = band_bytes(data_bytes, device)
    if device.type == "cpu":
        region, start = new_region(data_bytes, band, lead)
        region.bytes[:start].fill_(GUARD_BYTE)
        region.bytes[start + data_bytes:].fill_(GUARD_BYTE)
        return GuardedBuffer(region.bytes, start, data_bytes, label, region)
    backing = torch.full((data_bytes + 2 * band + lead,), GUARD_BYTE, dtype=torch.uint8,
                         device=device)
    return GuardedBuffer(backing, band + lead, data_bytes, label)


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


def _data_bytes(template: torch.Tensor) -> int:
    return template.untyped_storage().nbytes()


def guarded_like(template: torch.Tensor, label: str, device: torch.device | None = None
                 ) -> tuple[torch.Tensor, GuardedBuffer]:
    """An uninitialized, poisoned tensor shaped like `template`, between guard bands, on
    `device` (by default the template's)."""
    buffer = guarded_buffer(_data_bytes(template), device or template.device, label)
    tensor = buffer.view(template.dtype, template.shape, template.stride())
    poison(buffer.view(template.dtype, (buffer.data_bytes // template.element_size(),), (1,)))
    return tensor, buffer


def guarded_copy(source: torch.Tensor, label: str, lead: int = 0
                 ) -> tuple[torch.Tensor, GuardedBuffer | None]:
    """A fresh copy of an input between guard bands, with the same strides and the same bytes
    of the storage it reaches (views of a larger storage keep their offsets' gaps); `lead`:
    as `guarded_buffer`'s."""
    if source.numel() == 0:
        return source.clone(), None
    start, span = storage_span(source)
    buffer = guarded_buffer(span, source.device, label, lead)
    buffer.backing[buffer.data_start:buffer.data_start + span].copy_(
        raw_bytes(source, start, span))
    tensor = buffer.view(source.dtype, source.shape, source.stride())
    return tensor, buffer


# One allocation of a call: its bytes, dtype and device; `Guard.prepare` makes buffers for them.
Allocation = tuple[int, torch.dtype, torch.device]


def _meta_template(func: Any, args: tuple, kwargs: dict[str, Any]
                   ) -> tuple[torch.Tensor, torch.device]:
    """What an empty-allocation op (`EMPTY_OPS`) would make, as a meta tensor, and the device
    it would make it on: factories name theirs (none: the CPU), the others take their
    tensor argument's."""
    source = next((a for a in args if isinstance(a, torch.Tensor)), None)
    named = kwargs.get("device")
    device = torch.device(named) if named is not None else (
        source.device if source is not None else torch.device("cpu"))
    if device.type == "cuda" and device.index is None:  # as a tensor made there would name it
        device = torch.device("cuda", torch.cuda.current_device())
    meta_args = tuple(torch.empty_strided(a.shape, a.stride(), dtype=a.dtype, device="meta")
                      if isinstance(a, torch.Tensor) else a for a in args)
    meta_kwargs = {**kwargs, "device": torch.device("meta")}
    if "pin_memory" in meta_kwargs:
        meta_kwargs["pin_memory"] = False
    return func(*meta_args, **meta_kwargs), device


class Guard(TorchDispatchMode):
    """Active around one candidate call: traces torch ops, poisons and guards allocations."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: Counter[str] = Counter()
        self.launch_ops: Counter[str] = Counter()  # ops run while a kernel was being launched
        self.buffers: list[GuardedBuffer] = []
        self.allocations: list[Allocation] = []
        self.prepared: list[tuple[Allocation, GuardedBuffer]] = []
        self.launches_at_start = 0

    def prepare(self, allocations: list[Allocation]) -> None:
        """Poisoned buffers for these allocations, handed out in order when they come again."""
        for index, (data_bytes, dtype, device) in enumerate(allocations):
            buffer = guarded_buffer(data_bytes, device, f"allocation {index}")
            size = torch.empty((), dtype=dtype).element_size()
            poison(buffer.view(dtype, (data_bytes // size,), (1,)))
            self.prepared.append(((data_bytes, dtype, device), buffer))

    def __enter__(self) -> Guard:
        self.launches_at_start = COUNTER.launches
        return super().__enter__()

    @property
    def launches(self) -> int:
        return COUNTER.launches - self.launches_at_start

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        name = str(func.overloadpacket)
        if not COUNTER.depth and name in EMPTY_OPS:
            # The allocation's layout is found on the meta device, so that the guarded buffer
            # is the only memory it takes (an output as large as the inputs, made twice over,
            # would be a fourth of what judging may hold).
            try:
                template, device = _meta_template(func, args, kwargs)
            except (RuntimeError, TypeError, NotImplementedError):  # an overload meta can't
                template = device = None  # make: made for real below, guarded all the same
            if template is not None and template.numel() > 0 and device.type != "meta":
                self.ops[name] += 1
                return self.allocate(template, device, name)
        result = func(*args, **kwargs)
        if COUNTER.depth:
            self.launch_ops[name] += 1
            return result
        self.ops[name] += 1
        # A meta tensor (a shape the candidate computes with) holds no bytes to guard.
        if name in EMPTY_OPS and isinstance(result, torch.Tensor) and result.numel() > 0 \
                and not result.is_meta:
            return self.allocate(result, result.device, name)
        return result

    def allocate(self, template: torch.Tensor, device: torch.device, name: str) -> torch.Tensor:
        """Memory for an allocation laid out as `template` (a meta tensor, or the allocation
        itself) on `device`: the buffer prepared for it, or a new one, poisoned, between guard
        bands."""
        wanted = (_data_bytes(template), template.dtype, device)
        label = f"allocation {len(self.buffers)} ({name})"
        self.allocations.append(wanted)
        if self.prepared and self.prepared[0][0] == wanted:
            _, buffer = self.prepared.pop(0)
            buffer.label = label
            tensor = buffer.view(template.dtype, template.shape, template.stride())
        else:
            tensor, buffer = guarded_like(template, label, device)
        self.buffers.append(buffer)
        return tensor

    def compute_ops(self) -> list[str]:
        outside = [op for op in self.ops if op not in LAYOUT_OPS and op not in ANCHOR_OPS]
        inside = [f"{op} during a kernel launch" for op in self.launch_ops
                  if op not in LAYOUT_OPS]
        return sorted(outside) + sorted(inside)

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
