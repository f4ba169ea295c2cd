"""Run the project's CUDA C++ kernels on the CPU, so that machines without a GPU check what they
compute, as the Triton interpreter does for Triton kernels.

    from tests.cuda_on_cpu import load_kernel
    add = load_kernel(SOURCE, "add", "PPPi")
    add(grid=(blocks, 1, 1), block=(256, 1, 1), args=(x, y, out, n))   # CPU tensors

`load_kernel` takes what `core.runtime.cuda.load_kernel` takes, and `kernels_on_cpu()` puts it in
that one's place, so that a candidate module imported inside it runs on the CPU unchanged.

The source, wrapped in `extern "C"` as on the GPU (`core.runtime.cuda.wrap_source`), is compiled
by g++ after a prelude that defines CUDA's keywords, its thread indices and the intrinsics the
project's kernels use, with their GPU semantics. A launch runs its blocks one after another on
the calling thread, a block's threads as fibers, so that a run is deterministic and `__shared__`
variables can be plain statics. `__syncthreads()` waits for the block's threads; a warp shuffle
waits for the warp's lanes, then exchanges their values as the PTX `shfl.sync` instruction
defines. The warps of a block take turns, each running ahead as far as the barriers let it,
lowest first in one block and highest first in the next: a legal schedule on the GPU, and one
under which a missing barrier changes what threads read. A barrier or shuffle that not every
thread reaches, a hang or undefined behaviour on the GPU, raises `KernelFault` naming where each
thread waits.

Dynamic shared memory (`extern __shared__`) is a static of the most a sm_90 block may opt into,
and a launch asking more fails, as on the GPU. Not emulated: atomics, clusters and inline PTX
outside `__CUDA_ARCH__` guards (they fail to compile or to launch, with the reason); shuffles
whose mask leaves out lanes of the warp. Memory accesses are not bounds-checked: an
out-of-bounds access reads or writes the process's memory, or ends it. A kernel that loops
forever without reaching a barrier (a thread spinning on memory another thread is to write, say)
cannot be stopped; the process is ended after `timeout_s` so that a test run does not hang.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import re
import struct
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from core.runtime.cuda import MAX_DYNAMIC_SHARED, Launcher, wrap_source

COMPILER = ["g++", "-std=c++20", "-O1", "-fPIC", "-shared", "-fvisibility=hidden",
            # CUDA code puns types through pointers; results must not depend on the host's FMA.
            "-fno-strict-aliasing", "-ffp-contract=off"]
CACHE = Path(tempfile.gettempdir()) / f"kiln-cuda-on-cpu-{os.getuid()}"
ERROR_SIZE = 4096

# CUDA's keywords, thread indices and intrinsics for g++ (C++ with its own `#line`).
PRELUDE = (Path(__file__).parent / "data" / "cuda_on_cpu.h").read_text()

LAUNCHER = """
static void kiln_body_{name}(void* arguments) {{ kiln::call({name}, arguments); }}
extern "C" __attribute__((visibility("default"))) int kiln_launch_{name}(
        void* arguments, const unsigned int* geometry, char* error, unsigned long size) {{
    return kiln::run(geometry, kiln_body_{name}, arguments, error, size);
}}
extern "C" __attribute__((visibility("default"))) const char* kiln_parameters_{name}() {{
    return kiln::codes({name});
}}
"""
KERNEL = re.compile(r"__global__\s+(?:__launch_bounds__\s*\(\s*(\d*)[^)]*\)\s*)?void\s+"
                    r"(?:__launch_bounds__\s*\(\s*(\d*)[^)]*\)\s*)?(\w+)\s*\(")
COMMENT = re.compile(r"//[^\n]*|/\*.*?\*/", re.DOTALL)
# `extern __shared__ [__align__(n)] type name[];`: the launch's dynamic shared memory.
DYNAMIC_SHARED = re.compile(r"extern\s+__shared__\s+(__align__\s*\(\s*\d+\s*\)\s+)?"
                            r"([A-Za-z_][\w ]*?)\s+(\w+)\s*\[\s*\]\s*;")
# pycuda's argument codes (struct's), as the size class the prelude's `code` gives a parameter.
SIZE_CLASS = {"P": "P", "f": "f", "d": "d", "b": "b", "B": "b", "h": "h", "H": "h", "i": "i",
              "I": "i", "l": "q", "L": "q", "q": "q", "Q": "q"}
_libraries: dict[str, Library] = {}
_launching = threading.Lock()


class CompileError(RuntimeError):
    """g++ rejected a source; the message holds its diagnostics."""


class KernelFault(RuntimeError):
    """A launch that could not run to its end: its threads met no common barrier, or a shuffle
    broke the rules the emulator follows."""


@dataclass(frozen=True)
class Library:
    """A compiled source: its kernels' launch bounds (None where it states none)."""

    handle: ctypes.CDLL
    bounds: dict[str, int | None]


def kernels_of(source: str) -> dict[str, int | None]:
    """The `__global__` functions of a source, each with its `__launch_bounds__` thread count."""
    found = {}
    for match in KERNEL.finditer(COMMENT.sub("", source)):
        bound = match.group(1) or match.group(2)
        found[match.group(3)] = int(bound) if bound else None
    return found


def compile_source(source: str) -> Library:
    """The source with the prelude and a launcher a kernel, as a loaded library (compiled once
    per text: in this process, and on disk across processes)."""
    bounds = kernels_of(source)
    source = DYNAMIC_SHARED.sub(
        lambda m: f"{m.group(1) or ''}__shared__ {m.group(2)} {m.group(3)}"
                  f"[{MAX_DYNAMIC_SHARED} / sizeof({m.group(2)})];", source)
    text = (PRELUDE + wrap_source(source) + '#line 1 "launchers.cpp"\n'
            + "".join(LAUNCHER.format(name=name) for name in bounds))
    key = hashlib.sha256("\0".join([*COMPILER, text]).encode()).hexdigest()
    if key not in _libraries:
        CACHE.mkdir(parents=True, exist_ok=True)
        library = CACHE / f"{key}.so"
        if not library.exists():
            # Private names until the library is whole: other processes may compile it too.
            stem = f"{key}.{os.getpid()}.{threading.get_ident()}"
            code, partial = CACHE / f"{stem}.cpp", CACHE / f"{stem}.so"
            code.write_text(text)
            result = subprocess.run([*COMPILER, "-o", str(partial), str(code)],
                                    capture_output=True, text=True, check=False,
                                    env={**os.environ, "LC_ALL": "C"})  # plain quotes
            code.unlink()
            if result.returncode != 0:
                raise CompileError(f"g++ rejected the source:\n{result.stderr.strip()}")
            partial.replace(library)
        _libraries[key] = Library(ctypes.CDLL(str(library)), bounds)
    return _libraries[key]


class Kernel(Launcher):
    """A `__global__` function, called as `core.runtime.cuda.Kernel` is, on CPU tensors."""

    def __init__(self, library: Library, name: str, arg_types: str, timeout_s: float) -> None:
        if name not in library.bounds:
            raise LookupError(f"no __global__ function {name!r} in the source")
        self.name, self.arg_types, self.timeout_s = name, arg_types, timeout_s
        self.max_threads = library.bounds[name]
        self.entry = getattr(library.handle, f"kiln_launch_{name}")
        self.entry.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_uint),
                                ctypes.c_char_p, ctypes.c_ulong]
        parameters = getattr(library.handle, f"kiln_parameters_{name}")
        parameters.restype = ctypes.c_char_p
        wanted = parameters().decode()
        given = "".join(SIZE_CLASS.get(code, "?") for code in arg_types)
        if given != wanted:
            raise TypeError(f"{name} takes parameters of codes {wanted!r} (P pointer, f float, "
                            f"d double, b/h/i/q integers of 1/2/4/8 bytes); arg_types "
                            f"{arg_types!r} gives {given!r}")

    def launch(self, grid: tuple[int, int, int], block: tuple[int, int, int],
               args: Sequence[Any], shared_mem: int) -> None:
        threads = block[0] * block[1] * block[2]
        if self.max_threads is not None and threads > self.max_threads:
            raise ValueError(f"{self.name}: {threads} threads a block, past its "
                             f"__launch_bounds__({self.max_threads})")
        slots = []
        for code, arg in zip(self.arg_types, args, strict=True):
            if isinstance(arg, torch.Tensor):
                if arg.device.type != "cpu":
                    raise ValueError(f"{self.name}: a tensor on {arg.device}, not the CPU")
                arg = arg.data_ptr()
            slots.append(ctypes.create_string_buffer(struct.pack(code, arg)))
        pointers = (ctypes.c_void_p * max(len(slots), 1))(
            *[ctypes.cast(slot, ctypes.c_void_p) for slot in slots])
        geometry = (ctypes.c_uint * 6)(*grid, *block)
        error = ctypes.create_string_buffer(ERROR_SIZE)
        status: list[int] = []

        def run() -> None:
            with _launching:  # a source's statics serve one launch at a time
                status.append(self.entry(pointers, geometry, error, ERROR_SIZE))

        worker = threading.Thread(target=run, daemon=True)
        worker.start()
        worker.join(self.timeout_s)
        if worker.is_alive():
            # Its threads may still write into tensors Python would free: end the process.
            sys.stderr.write(f"{self.name} ran past {self.timeout_s} s on the CPU (a loop that "
                             "never ends?); ending the process\n")
            sys.stderr.flush()
            os._exit(70)
        if status[0]:
            raise KernelFault(f"{self.name}: {error.value.decode()}")


def load_kernel(source: str, name: str, arg_types: str, options: Sequence[str] = (),
                cooperative: bool = False, *, timeout_s: float = 300.0) -> Kernel:
    """`core.runtime.cuda.load_kernel` for the CPU; `options` (nvcc's) are accepted and unused.
    A cooperative kernel's blocks wait for each other, which blocks run one after another never
    do: it is refused."""
    if cooperative:
        raise NotImplementedError(f"{name}: a cooperative kernel (its blocks wait for each "
                                  "other) runs on a GPU only; the CPU runs blocks one by one")
    return Kernel(compile_source(source), name, arg_types, timeout_s)


@contextmanager
def kernels_on_cpu() -> Iterator[None]:
    """Candidate modules imported inside load their kernels with this module's `load_kernel`
    (they import `core.runtime.cuda.load_kernel` when they are imported)."""
    import core.runtime.cuda as runtime

    saved = runtime.load_kernel
    runtime.load_kernel = load_kernel
    try:
        yield
    finally:
        runtime.load_kernel = saved
