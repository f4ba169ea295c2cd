"""Compile CUDA C++ with pycuda and launch it on torch tensors, ordered with torch's own work.

This file is self-contained (torch, numpy, pycuda and the standard library only) so that it can
ship beside exported kernels:

    from core.runtime.cuda import load_kernel
    add = load_kernel(SOURCE, "add", "PPPi")          # pointer, pointer, pointer, int32
    add(grid=(blocks, 1, 1), block=(256, 1, 1), args=(x, y, out, n))

Sources are wrapped in `extern "C"` so kernel names are not mangled, and compiled once per
process (keyed by a hash of source and options; pycuda also keeps compiled cubins on disk).
pycuda shares torch's CUDA context (the device's primary context). pycuda can launch only on its
own streams or the legacy default stream, so a launch goes on the legacy default stream when
torch's current stream is the default stream (the same stream, so it is ordered), and otherwise
on a pycuda stream that torch sees as an `ExternalStream`, fenced on both sides with events.
"""

from __future__ import annotations

import atexit
import hashlib
import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

WRAPPED_SOURCE = 'extern "C" {{\n#line 1 "{name}"\n{source}\n}}\n'
_modules: dict[str, Any] = {}
_contexts: dict[int, Any] = {}
_side_streams: dict[int, tuple[Any, torch.cuda.ExternalStream]] = {}


def wrap_source(source: str, name: str = "kernel.cu") -> str:
    """`extern "C"` around the source, with a `#line` so compiler messages keep its line numbers."""
    return WRAPPED_SOURCE.format(name=name, source=source)


def ensure_context(device_index: int | None = None) -> int:
    """Make torch's primary context for the device current for pycuda in this thread."""
    import pycuda.driver as drv

    index = torch.cuda.current_device() if device_index is None else device_index
    if index not in _contexts:
        torch.cuda.init()
        torch.empty(1, device=f"cuda:{index}")
        drv.init()
        context = drv.Device(index).retain_primary_context()
        context.push()
        # pycuda aborts the process at exit if a context is still on its stack.
        atexit.register(context.pop)
        _contexts[index] = context
    return index


def compile_module(source: str, options: Sequence[str] = ()) -> Any:
    """Compile a CUDA source into a loaded pycuda module (once per process per source)."""
    from pycuda.compiler import SourceModule

    index = ensure_context()
    key = hashlib.sha256("\0".join([source, *options, str(index)]).encode()).hexdigest()
    if key not in _modules:
        _modules[key] = SourceModule(wrap_source(source), options=list(options), no_extern_c=True)
    return _modules[key]


# The most dynamic shared memory a sm_90 block may opt into.
MAX_DYNAMIC_SHARED = 227 * 1024


def launch_error(grid: tuple[int, int, int], block: tuple[int, int, int],
                 shared_mem: int = 0) -> str | None:
    """Why no sm_90 GPU takes this launch, or None: the driver itself says only "invalid
    argument"."""
    if min(*grid, *block) < 1:
        return (f"grid {grid} of blocks {block} has an empty dimension: skip the launch when "
                "there is no work")
    if grid[0] > 2**31 - 1 or max(grid[1:]) > 65535:
        return (f"grid {grid}: CUDA takes at most 2**31 - 1 blocks along x and 65535 along y "
                "and z: put the largest count on x, or have each block walk several")
    if block[0] * block[1] * block[2] > 1024 or block[2] > 64:
        return f"blocks of {block} threads: a block has at most 1024 (64 along z)"
    if shared_mem > MAX_DYNAMIC_SHARED:
        return (f"{shared_mem} bytes of dynamic shared memory, more than a sm_90 block may have "
                f"({MAX_DYNAMIC_SHARED})")
    return None


class Kernel:
    """A `__global__` function; `arg_types` as in pycuda: "P" pointer, "i" int32, "f" float."""

    def __init__(self, function: Any, arg_types: str, name: str = "kernel") -> None:
        self.function = function.prepare(arg_types)
        self.arg_types, self.name = arg_types, name
        self.shared_allowed = 48 * 1024  # dynamic shared memory a block gets without opting in

    def __call__(
        self,
        grid: tuple[int, int, int],
        block: tuple[int, int, int],
        args: Sequence[Any],
        shared_mem: int = 0,
    ) -> None:
        problem = launch_error(grid, block, shared_mem)
        if problem is not None:
            raise ValueError(f"{self.name}: {problem}")
        raw = [a.data_ptr() if isinstance(a, torch.Tensor) else a for a in args]
        if shared_mem > self.shared_allowed:
            import pycuda.driver as drv

            self.function.set_attribute(
                drv.function_attribute.MAX_DYNAMIC_SHARED_SIZE_BYTES, shared_mem)
            self.shared_allowed = shared_mem
        current = torch.cuda.current_stream()
        if current.cuda_stream == 0:
            self.function.prepared_async_call(grid, block, None, *raw, shared_size=shared_mem)
            return
        pycuda_stream, torch_view = _side_stream(current.device.index)
        torch_view.wait_stream(current)
        self.function.prepared_async_call(
            grid, block, pycuda_stream, *raw, shared_size=shared_mem
        )
        current.wait_stream(torch_view)
        for arg in args:
            if isinstance(arg, torch.Tensor):
                arg.record_stream(torch_view)


def _side_stream(device_index: int) -> tuple[Any, torch.cuda.ExternalStream]:
    import pycuda.driver as drv

    if device_index not in _side_streams:
        ensure_context(device_index)
        stream = drv.Stream()
        _side_streams[device_index] = (
            stream,
            torch.cuda.ExternalStream(stream.handle, device=torch.device("cuda", device_index)),
        )
    return _side_streams[device_index]


def load_kernel(source: str, name: str, arg_types: str, options: Sequence[str] = ()) -> Kernel:
    return Kernel(compile_module(source, options).get_function(name), arg_types, name)


def nvcc_check(source: str, arch: str = "sm_90", nvcc: str | None = None) -> tuple[bool, str]:
    """Compile a source to a cubin with nvcc, without a GPU; returns (ok, compiler messages)."""
    compiler = nvcc or shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc"
    if not Path(compiler).exists():
        raise FileNotFoundError("nvcc not found on PATH or in /usr/local/cuda/bin")
    with tempfile.TemporaryDirectory(prefix="kiln-nvcc-") as folder:
        path = Path(folder) / "kernel.cu"
        path.write_text(wrap_source(source))
        result = subprocess.run(
            [compiler, f"-arch={arch}", "-cubin", "-o", str(Path(folder) / "kernel.cubin"),
             str(path)],
            capture_output=True, text=True, cwd=folder, check=False,
        )
    return result.returncode == 0, (result.stdout + result.stderr).strip()
