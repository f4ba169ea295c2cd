"""Values crossing between the judge and a candidate's process: nested outputs and inputs as JSON
trees whose tensors are shared memory (`core.evaluate.transport`).

The judge hands in inputs it allocated (`SharedInput`: guarded copies; it keeps the tensors and
their bands to check after the call) and maps the outputs the candidate's process hands back. A
candidate's process keeps each input buffer it was given under the judge's number for it, so
that a buffer handed in again is the same memory at the same address.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch

from core.evaluate.guard import GuardedBuffer, guarded_copy
from core.evaluate.transport import (
    DTYPES,
    Region,
    TransportError,
    close_all,
    export_cuda,
    import_cuda,
    map_region,
    new_region,
    raw_bytes,
    reference_count,
    typed_view,
)
from core.runtime.problem_loader import storage_span


@dataclass(frozen=True)
class Opaque:
    """A value a candidate returned that does not cross: a tensor subclass, an object."""

    description: str


class HandOverFailed(RuntimeError):
    """Tensors could not cross between the judge and the candidate's process (a CUDA IPC
    mapping the driver refused, say): no fault of the candidate's."""


# The driver's refusal of an IPC mapping (cudaErrorMapBufferObjectFailed): seen under load,
# gone on a fresh process (bench/NOTES.md, "2026-12-05, 21:27-21:36 UTC").
IPC_REFUSALS = ("mapping of buffer object failed", "cudaErrorMapBufferObjectFailed")


@contextmanager
def handing_over(what: str, every_error: bool = False) -> Iterator[None]:
    """The evaluator's own step of moving tensors: an IPC refusal in it (any error at all,
    with `every_error`: no candidate code runs in it) is a `HandOverFailed`."""
    try:
        yield
    except Exception as err:
        if every_error or any(marker in str(err) for marker in IPC_REFUSALS):
            raise HandOverFailed(f"{what}: {type(err).__name__}: {err}") from err
        raise


def encode(value: object, export: Callable[[torch.Tensor], dict[str, Any]]) -> dict[str, Any]:
    if isinstance(value, torch.Tensor):
        if type(value) is not torch.Tensor:
            return {"t": "opaque", "what": f"a {type(value).__name__} (a tensor subclass)"}
        return {"t": "tensor", **export(value)}
    if isinstance(value, tuple | list):
        return {"t": type(value).__name__, "items": [encode(v, export) for v in value]}
    if isinstance(value, dict) and all(isinstance(k, str) for k in value):
        return {"t": "dict", "items": [[k, encode(v, export)] for k, v in value.items()]}
    if value is None or type(value) in (bool, int, float, str):
        return {"t": "value", "v": value}
    return {"t": "opaque", "what": f"a {type(value).__name__}"}


def decode(record: object, load: Callable[[dict[str, Any]], torch.Tensor]) -> object:
    if not isinstance(record, dict) or "t" not in record:
        raise TransportError("a value's description is malformed")
    kind = record["t"]
    if kind == "tensor":
        return load(record)
    if kind in ("tuple", "list"):
        items = [decode(item, load) for item in record["items"]]
        return tuple(items) if kind == "tuple" else items
    if kind == "dict":
        return {str(key): decode(item, load) for key, item in record["items"]}
    if kind == "value":
        return record["v"]
    if kind == "opaque":
        return Opaque(str(record.get("what", "a value")))
    raise TransportError(f"a value of unknown kind {kind!r}")


def _layout(tensor: torch.Tensor) -> dict[str, Any]:
    return {"dtype": str(tensor.dtype), "shape": list(tensor.shape),
            "stride": list(tensor.stride()), "offset": tensor.storage_offset()}


def _dtype(record: dict[str, Any]) -> torch.dtype:
    dtype = DTYPES.get(record.get("dtype", ""))
    if dtype is None:
        raise TransportError(f"unknown dtype {record.get('dtype')!r}")
    return dtype


@dataclass
class SharedInput:
    """A guarded copy of one input tensor, allocated by the judge and handed in by number."""

    number: int
    tensor: torch.Tensor
    buffer: GuardedBuffer | None


class JudgeSide:
    """The judge's half: numbers the input buffers it hands in, sends each buffer's memory the
    first time, and maps the outputs that come back."""

    def __init__(self) -> None:
        self.count = 0
        self.sent: set[int] = set()
        self.dropped: list[int] = []
        # Each CUDA buffer's IPC reference count, as its export named it: what the receiver
        # gives back when it lets go of the buffer (`release_counts`).
        self.counts: dict[int, tuple[bytes, int]] = {}
        self.keep: list[object] = []  # one-off copies, alive until their message is sent

    def shared_copy(self, source: torch.Tensor, label: str, lead: int = 0) -> SharedInput:
        """A guarded copy of `source` to hand in; `lead`: as `guard.guarded_buffer`'s."""
        if source.numel() == 0:
            return SharedInput(-1, source.clone(), None)
        self.count += 1
        tensor, buffer = guarded_copy(source, label, lead)
        return SharedInput(self.count, tensor, buffer)

    def forget(self, shared: SharedInput) -> None:
        """The candidate's process may let go of this buffer."""
        if shared.number in self.sent:
            self.sent.discard(shared.number)
            self.dropped.append(shared.number)

    def encode_inputs(self, values: list[object]) -> tuple[list[dict[str, Any]], list[int]]:
        fds: list[int] = []
        self.keep = []

        def one_off(tensor: torch.Tensor) -> dict[str, Any]:
            shared = self.shared_copy(tensor, "value") if tensor.numel() else SharedInput(
                -1, tensor, None)
            self.keep.append(shared)
            return self._export(shared, fds)

        return [{"t": "tensor", **self._export(v, fds)} if isinstance(v, SharedInput)
                else encode(v, one_off) for v in values], fds

    def _export(self, shared: SharedInput, fds: list[int]) -> dict[str, Any]:
        tensor = shared.tensor
        if tensor.numel() == 0:
            return {"empty": True, **_layout(tensor)}
        if tensor.device.type == "cuda":
            # A buffer the candidate's process holds already goes by its number alone: an IPC
            # export makes an event and a reference count each time.
            record = {"number": shared.number}
            if shared.number not in self.sent:
                record["cuda"] = export_cuda(tensor)
                self.counts[shared.number] = reference_count(record["cuda"])
        else:
            assert shared.buffer is not None and shared.buffer.region is not None
            region = shared.buffer.region
            record = {"number": shared.number, "size": region.size, **_layout(tensor)}
            if shared.number not in self.sent:
                record["fd"] = len(fds)
                fds.append(region.fd)
        self.sent.add(shared.number)
        return record

    def take_dropped(self) -> list[int]:
        dropped, self.dropped = self.dropped, []
        return dropped

    def release_counts(self, numbers: list[int]) -> None:
        """Give back, for a receiver that has exited, its reference to each of the CUDA buffers
        `numbers` it still held: a process that ends holding one never gives it back itself,
        and the buffer would stay allocated for as long as this process lives. Only once the
        receiver has exited (its mappings gone with it)."""
        for number in numbers:
            count = self.counts.pop(number, None)
            if count is not None:
                torch.UntypedStorage._release_ipc_counter_cuda(*count)


def empty_tensor(record: dict[str, Any], device: torch.device) -> torch.Tensor:
    shape = record.get("shape")
    if not isinstance(shape, list) or 0 not in shape:
        raise TransportError("an empty tensor with elements")
    return torch.empty(shape, dtype=_dtype(record), device=device)


def load_output(fds: list[int], used: set[int], device: torch.device
                ) -> Callable[[dict[str, Any]], torch.Tensor]:
    """How the judge maps a tensor a candidate's process handed back."""

    def load(record: dict[str, Any]) -> torch.Tensor:
        if record.get("empty"):
            return empty_tensor(record, device)
        if "cuda" in record:
            with handing_over("receiving the outputs"):
                return import_cuda(record["cuda"])
        index, size = record.get("fd"), record.get("size")
        if not isinstance(index, int) or not 0 <= index < len(fds) or index in used:
            raise TransportError("a tensor names no file descriptor of its message")
        if not isinstance(size, int) or size <= 0 or size % 4096:
            raise TransportError("a tensor's shared memory has an impossible size")
        used.add(index)
        region = map_region(fds[index], size)
        return typed_view(region.bytes, _dtype(record), record["offset"], record["shape"],
                          record["stride"])

    return load


def close_unused(fds: list[int], used: set[int]) -> None:
    close_all([fd for index, fd in enumerate(fds) if index not in used])


@dataclass
class CandidateSide:
    """The half in a candidate's process: the input buffers it was handed, by number, and the
    shared buffers it can hand back without copying."""

    device: torch.device
    inputs: dict[int, torch.Tensor] = field(default_factory=dict)
    regions: dict[int, Region] = field(default_factory=dict)  # by data pointer, CPU only
    input_pointers: set[int] = field(default_factory=set)  # of CUDA input storages
    keep: list[object] = field(default_factory=list)  # copies alive until their message is sent

    def load_input(self, record: dict[str, Any], fds: list[int]) -> torch.Tensor:
        number = record.get("number", -1)
        if record.get("empty"):
            return empty_tensor(record, self.device)
        if number in self.inputs:
            return self.inputs[number]
        if "cuda" in record:
            tensor = import_cuda(record["cuda"])
            self.input_pointers.add(tensor.untyped_storage().data_ptr())
        elif "fd" not in record:
            raise TransportError(f"input buffer {number} was never handed in")
        else:
            region = map_region(fds[record["fd"]], record["size"])
            self.regions[region.bytes.data_ptr()] = region
            tensor = typed_view(region.bytes, _dtype(record), record["offset"],
                                record["shape"], record["stride"])
        if number >= 0:
            self.inputs[number] = tensor
        return tensor

    def forget(self, numbers: list[int]) -> None:
        for number in numbers:
            tensor = self.inputs.pop(number, None)
            if tensor is not None and tensor.device.type == "cpu":
                self.regions.pop(tensor.untyped_storage().data_ptr(), None)

    def export_output(self, tensor: torch.Tensor, fds: list[int],
                      buffers: list[GuardedBuffer]) -> dict[str, Any]:
        if tensor.numel() == 0:
            return {"empty": True, **_layout(tensor)}
        if tensor.device.type == "cuda":
            if tensor.untyped_storage().data_ptr() in self.input_pointers:
                tensor = tensor.clone()  # memory received over IPC cannot be sent on
            return {"cuda": export_cuda(tensor)}
        known = {b.region.bytes.data_ptr(): b.region for b in buffers if b.region is not None}
        known.update(self.regions)
        region = known.get(tensor.untyped_storage().data_ptr())
        if region is None:
            start, span = storage_span(tensor)
            region, data_start = new_region(span, 0)
            region.bytes[data_start:].copy_(raw_bytes(tensor, start, span))
            self.keep.append(region)
            tensor = typed_view(region.bytes, tensor.dtype,
                                data_start // tensor.element_size(), list(tensor.shape),
                                list(tensor.stride()))
        fds.append(region.fd)
        return {"fd": len(fds) - 1, "size": region.size, **_layout(tensor)}
