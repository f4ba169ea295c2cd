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

A kernel whose thread-block clusters have more than 8 blocks (`__cluster_dims__`) needs a
function attribute pycuda cannot set, and a kernel whose blocks wait for each other
(`cooperative=True`) a launch that makes them all resident at once, which pycuda does not offer;
both are loaded and launched through the CUDA driver itself (ctypes), on torch's current stream.
"""

from __future__ import annotations

import atexit
import ctypes
import hashlib
import math
import re
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


# The shared memory and registers of a sm_90 SM, and the most dynamic shared memory a block may
# opt into.
SM_SHARED_BYTES = 228 * 1024
SM_REGISTERS = 64 * 1024
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


class Launcher:
    """A `__global__` function's launches: CUDA's limits (`launch_error`) and the count of
    arguments checked, then `launch`. `arg_types` as in pycuda: "P" pointer, "i" int32, "f"
    float."""

    name: str
    arg_types: str

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
        if len(args) != len(self.arg_types):
            raise TypeError(f"{self.name} takes {len(self.arg_types)} arguments, given "
                            f"{len(args)}")
        self.launch(grid, block, args, shared_mem)

    def launch(self, grid: tuple[int, int, int], block: tuple[int, int, int],
               args: Sequence[Any], shared_mem: int) -> None:
        raise NotImplementedError


class Kernel(Launcher):
    """A `__global__` function launched by pycuda."""

    def __init__(self, function: Any, arg_types: str, name: str = "kernel") -> None:
        self.function = function.prepare(arg_types)
        self.arg_types, self.name = arg_types, name
        self.shared_allowed = 48 * 1024  # dynamic shared memory a block gets without opting in

    def launch(self, grid: tuple[int, int, int], block: tuple[int, int, int],
               args: Sequence[Any], shared_mem: int) -> None:
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


# The most blocks a cluster may have without CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED.
PORTABLE_CLUSTER = 8
_CLUSTER_DIMS = r"__cluster_dims__\s*\(\s*(\d+)\s*,\s*(\d+)\s*,\s*(\d+)\s*\)"
# cuda.h's values.
_MAX_DYNAMIC_SHARED_SIZE_BYTES, _NON_PORTABLE_CLUSTER_SIZE_ALLOWED = 8, 14
# pycuda's argument codes, as ctypes values.
_ARGUMENTS = {"P": ctypes.c_uint64, "i": ctypes.c_int32, "I": ctypes.c_uint32,
              "q": ctypes.c_int64, "Q": ctypes.c_uint64, "f": ctypes.c_float,
              "d": ctypes.c_double}
_driver_library: list[Any] = []


def cluster_blocks(source: str, name: str) -> int:
    """The blocks of the compile-time cluster (`__cluster_dims__` in numbers) of the function
    `name` in `source`; 1 without one."""
    found = re.search(_CLUSTER_DIMS + r"[^;{}]*?\b" + re.escape(name) + r"\s*\(", source)
    return math.prod(int(n) for n in found.groups()) if found else 1


def _driver() -> Any:
    """libcuda, its functions' argument types declared."""
    if not _driver_library:
        lib = ctypes.CDLL("libcuda.so.1")
        handle, pointer = ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p)
        lib.cuModuleLoadData.argtypes = [pointer, ctypes.c_char_p]
        lib.cuModuleGetFunction.argtypes = [pointer, handle, ctypes.c_char_p]
        lib.cuFuncSetAttribute.argtypes = [handle, ctypes.c_int, ctypes.c_int]
        lib.cuLaunchKernel.argtypes = [handle, *[ctypes.c_uint] * 7, handle, pointer, handle]
        lib.cuLaunchCooperativeKernel.argtypes = [handle, *[ctypes.c_uint] * 7, handle, pointer]
        lib.cuGetErrorString.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)]
        _driver_library.append(lib)
    return _driver_library[0]


def _check(result: int, what: str) -> None:
    if result != 0:
        message = ctypes.c_char_p()
        _driver().cuGetErrorString(result, ctypes.byref(message))
        text = message.value.decode() if message.value else "unknown error"
        raise RuntimeError(f"CUDA error {result} {what}: {text}")


class DriverKernel(Launcher):
    """A `__global__` function loaded and launched through the CUDA driver, for clusters of more
    than PORTABLE_CLUSTER blocks, or `cooperative`: every block of a launch resident at once (the
    driver refuses a grid that cannot be), for blocks that wait for each other. As `Kernel`
    otherwise. pycuda compiles it (and keeps the cubin in its cache)."""

    def __init__(self, source: str, name: str, arg_types: str,
                 options: Sequence[str] = (), cooperative: bool = False) -> None:
        unknown = set(arg_types) - set(_ARGUMENTS)
        if unknown:
            raise ValueError(f"{name}: argument codes {sorted(unknown)} are not among "
                             f"{''.join(_ARGUMENTS)}")
        from pycuda.compiler import compile as compile_cubin

        ensure_context()
        driver = _driver()
        key = hashlib.sha256("\0".join(["driver", source, *options]).encode()).hexdigest()
        if key not in _modules:
            cubin = compile_cubin(wrap_source(source), options=list(options), no_extern_c=True)
            module = ctypes.c_void_p()
            _check(driver.cuModuleLoadData(ctypes.byref(module), cubin), "loading the module")
            _modules[key] = module
        self.function = ctypes.c_void_p()
        _check(driver.cuModuleGetFunction(ctypes.byref(self.function), _modules[key],
                                          name.encode()), f"finding {name}")
        if cluster_blocks(source, name) > PORTABLE_CLUSTER:
            _check(driver.cuFuncSetAttribute(self.function, _NON_PORTABLE_CLUSTER_SIZE_ALLOWED,
                                             1),
                   f"allowing {name} clusters of more than {PORTABLE_CLUSTER} blocks")
        self.arg_types, self.name, self.cooperative = arg_types, name, cooperative
        self.shared_allowed = 48 * 1024

    def launch(self, grid: tuple[int, int, int], block: tuple[int, int, int],
               args: Sequence[Any], shared_mem: int) -> None:
        driver = _driver()
        if shared_mem > self.shared_allowed:
            _check(driver.cuFuncSetAttribute(self.function, _MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                             shared_mem), f"giving {self.name} shared memory")
            self.shared_allowed = shared_mem
        values = [_ARGUMENTS[code](arg.data_ptr() if isinstance(arg, torch.Tensor) else arg)
                  for code, arg in zip(self.arg_types, args, strict=True)]
        pointers = (ctypes.c_void_p * len(values))(*[ctypes.addressof(v) for v in values])
        stream = ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)
        if self.cooperative:
            _check(driver.cuLaunchCooperativeKernel(self.function, *grid, *block, shared_mem,
                                                    stream, pointers),
                   f"launching {self.name} cooperatively ({math.prod(grid)} blocks, all "
                   "resident at once)")
            return
        _check(driver.cuLaunchKernel(self.function, *grid, *block, shared_mem, stream, pointers,
                                     None), f"launching {self.name}")


def load_kernel(source: str, name: str, arg_types: str,
                options: Sequence[str] = (), cooperative: bool = False) -> Launcher:
    """`name` of `source`, compiled, launched as `Launcher` says; `cooperative`: its blocks wait
    for each other, so a launch makes them all resident at once (`DriverKernel`)."""
    if cooperative or cluster_blocks(source, name) > PORTABLE_CLUSTER:
        return DriverKernel(source, name, arg_types, options, cooperative)
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
