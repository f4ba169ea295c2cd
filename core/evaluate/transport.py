"""How tensors and messages cross between the judge and a candidate's process.

Messages are JSON objects on a Unix SOCK_SEQPACKET socket, each with the file descriptors it
carries. The judge decodes only JSON from a candidate's process, never pickles.

Tensors cross as shared memory, without copies:
- on the CPU, as memory-backed files (`memfd_create`) mapped by both processes (`Region`). A
  tensor's data sit between two guard bands inside the file, whose pattern either process can
  check, and each mapping between inaccessible guards sized to it (up to `MAX_GUARD_BYTES`): a
  write past a band faults.
- on CUDA, through CUDA IPC (`torch.multiprocessing`'s reductions), the allocator of the
  process that made the tensor keeping it alive until the other lets go.
"""

from __future__ import annotations

import array
import base64
import ctypes
import json
import mmap
import os
import socket
import weakref
from dataclasses import dataclass
from typing import Any

import torch

PAGE = mmap.PAGESIZE
# A region's inaccessible guard on each side: the data's size, at least a page, at most this.
MAX_GUARD_BYTES = 64 << 20
MAX_MESSAGE_BYTES = 4 << 20
MAX_FDS = 64
DTYPES = {str(dtype): dtype for dtype in (
    torch.float64, torch.float32, torch.float16, torch.bfloat16, torch.int64, torch.int32,
    torch.int16, torch.int8, torch.uint8, torch.bool, torch.complex64, torch.complex128,
    torch.float8_e4m3fn, torch.float8_e5m2)}

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                       ctypes.c_int, ctypes.c_long]
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
MAP_FAILED = ctypes.c_void_p(-1).value
MAP_NORESERVE = 0x4000
PROT_NONE = 0
MAP_FIXED = 0x10


class TransportError(RuntimeError):
    """A message or a shared tensor that does not decode: the other side broke the protocol."""


def socket_pair() -> tuple[socket.socket, socket.socket]:
    first, second = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    for end in (first, second):
        end.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, MAX_MESSAGE_BYTES)
        end.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, MAX_MESSAGE_BYTES)
    return first, second


def send(sock: socket.socket, message: dict[str, Any], fds: list[int] = ()) -> None:
    data = json.dumps(message).encode()
    if len(data) > MAX_MESSAGE_BYTES:
        raise TransportError(f"a message of {len(data)} bytes is too long")
    ancillary = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))] if fds else []
    sock.sendmsg([data], ancillary)


def receive(sock: socket.socket) -> tuple[dict[str, Any] | None, list[int]]:
    """The next message and its file descriptors; (None, []) when the other end closed."""
    try:
        data, ancillary, flags, _ = sock.recvmsg(MAX_MESSAGE_BYTES,
                                                 socket.CMSG_SPACE(MAX_FDS * 4))
    except ConnectionResetError:  # closed with messages of ours unread: closed all the same
        return None, []
    fds: list[int] = []
    for level, kind, payload in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            usable = len(payload) - len(payload) % 4
            fds += array.array("i", payload[:usable]).tolist()
    if flags & (socket.MSG_TRUNC | socket.MSG_CTRUNC):
        close_all(fds)
        raise TransportError("a message was cut short")
    if not data:
        close_all(fds)
        return None, []
    try:
        message = json.loads(data)
    except (ValueError, UnicodeDecodeError) as err:
        close_all(fds)
        raise TransportError(f"a message is not JSON: {err}") from err
    if not isinstance(message, dict):
        close_all(fds)
        raise TransportError("a message is not a JSON object")
    return message, fds


def close_all(fds: list[int]) -> None:
    for fd in fds:
        os.close(fd)


def guard_bytes(data_bytes: int) -> int:
    """The guard on each side of `data_bytes`: sized to the data, a page at least."""
    return max(PAGE, min(MAX_GUARD_BYTES, -(-data_bytes // PAGE) * PAGE))


@dataclass
class Region:
    """A memory-backed file mapped between inaccessible guards; `bytes` views the whole file."""

    fd: int
    size: int
    bytes: torch.Tensor


def _unmap(base: int, length: int, fd: int) -> None:
    _libc.munmap(base, length)
    os.close(fd)


def map_region(fd: int, size: int) -> Region:
    """Map the file `fd` of `size` bytes (a multiple of the page) between guards; the region
    owns `fd` and closes it when `bytes` and every tensor on it are gone."""
    guard = guard_bytes(size)
    total = size + 2 * guard
    base = _libc.mmap(None, total, PROT_NONE,
                      mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | MAP_NORESERVE, -1, 0)
    if base in (None, MAP_FAILED):
        os.close(fd)
        raise MemoryError(f"cannot reserve {total} bytes of address space: "
                          f"{os.strerror(ctypes.get_errno())}")
    address = _libc.mmap(base + guard, size, mmap.PROT_READ | mmap.PROT_WRITE,
                         mmap.MAP_SHARED | MAP_FIXED, fd, 0)
    if address in (None, MAP_FAILED):
        _unmap(base, total, fd)
        raise MemoryError(f"cannot map {size} bytes: {os.strerror(ctypes.get_errno())}")
    window = (ctypes.c_ubyte * size).from_address(address)
    weakref.finalize(window, _unmap, base, total, fd)
    return Region(fd, size, torch.frombuffer(window, dtype=torch.uint8))


def new_region(data_bytes: int, band: int, lead: int = 0) -> tuple[Region, int]:
    """A fresh region holding `data_bytes` of data between two bands, the lower one at least
    `band + lead` bytes and the upper one exactly `band` (a multiple of the page), ending at
    the region's top; the region and the data's byte offset in it."""
    size = -(-(band + lead + data_bytes) // PAGE) * PAGE + band
    fd = os.memfd_create("kiln-tensor", os.MFD_CLOEXEC)
    try:
        os.ftruncate(fd, size)
    except OSError:
        os.close(fd)
        raise
    return map_region(fd, size), size - band - data_bytes


def typed_view(region_bytes: torch.Tensor, dtype: torch.dtype, offset: int,
               shape: list[int], stride: list[int]) -> torch.Tensor:
    """The tensor of `dtype` at element `offset` of a region, checked to lie inside it."""
    size = torch.empty((), dtype=dtype).element_size()
    if region_bytes.numel() % size:
        raise TransportError("a region's size is not a multiple of its element size")
    elements = region_bytes.numel() // size
    if (offset < 0 or any(s < 0 for s in shape) or any(s < 0 for s in stride)
            or len(shape) != len(stride)):
        raise TransportError("a tensor's offset, shape or strides are negative")
    if all(shape):
        last = offset + sum((n - 1) * s for n, s in zip(shape, stride, strict=True))
        if last >= elements:
            raise TransportError("a tensor reaches past the end of its shared memory")
    flat = region_bytes.view(dtype)
    return torch.as_strided(flat, shape, stride, offset)


def raw_bytes(tensor: torch.Tensor, start: int, length: int) -> torch.Tensor:
    """`length` bytes of the tensor's storage from byte `start`, as a flat uint8 view."""
    whole = torch.empty(0, dtype=torch.uint8, device=tensor.device)
    whole.set_(tensor.untyped_storage())
    return whole[start:start + length]


# CUDA tensors cross with torch's own IPC reductions; their arguments travel as JSON.
_CUDA_ARGS = ("size", "stride", "offset", "storage_cls", "dtype", "device", "handle",
              "storage_bytes", "storage_offset_bytes", "requires_grad", "ref_counter_handle",
              "ref_counter_offset", "event_handle", "event_sync_required")


def export_cuda(tensor: torch.Tensor) -> dict[str, Any]:
    from torch.multiprocessing.reductions import reduce_tensor

    _, args = reduce_tensor(tensor)
    record = dict(zip(_CUDA_ARGS, args[1:], strict=True))
    record["size"], record["stride"] = list(record["size"]), list(record["stride"])
    record["dtype"] = str(record["dtype"])
    record.pop("storage_cls")
    for key in ("handle", "ref_counter_handle", "event_handle"):
        if isinstance(record[key], bytes):
            record[key] = base64.b64encode(record[key]).decode()
    return record


def reference_count(record: dict[str, Any]) -> tuple[bytes, int]:
    """Where an exported CUDA tensor's IPC reference count lives: its file and offset."""
    handle = record["ref_counter_handle"]
    return (base64.b64decode(handle) if isinstance(handle, str) else handle,
            int(record["ref_counter_offset"]))


def import_cuda(record: dict[str, Any]) -> torch.Tensor:
    from torch.multiprocessing.reductions import rebuild_cuda_tensor

    try:
        values = {key: record[key] for key in _CUDA_ARGS if key != "storage_cls"}
        dtype = DTYPES[values["dtype"]]
        for key in ("handle", "ref_counter_handle", "event_handle"):
            if isinstance(values[key], str):
                values[key] = base64.b64decode(values[key])
        ints = ("offset", "device", "storage_bytes", "storage_offset_bytes",
                "ref_counter_offset")
        if not all(isinstance(values[k], int) for k in ints):
            raise TransportError("a CUDA tensor's description is malformed")
        return rebuild_cuda_tensor(
            torch.Tensor, torch.Size(values["size"]), tuple(values["stride"]),
            values["offset"], torch.storage.TypedStorage, dtype, values["device"],
            values["handle"], values["storage_bytes"], values["storage_offset_bytes"], False,
            values["ref_counter_handle"], values["ref_counter_offset"], values["event_handle"],
            bool(values["event_sync_required"]))
    except (KeyError, TypeError, ValueError) as err:
        raise TransportError(f"a CUDA tensor's description is malformed: {err}") from err
