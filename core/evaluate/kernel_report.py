"""What the compiler made of a candidate's kernels: registers, spills, shared memory, load widths.

No hardware counters: these figures come from the compiler and the machine code alone.
- CUDA sources (the `__global__` strings the static check finds) are compiled for sm_90 with
  `nvcc --resource-usage` (ptxas's own count of registers, spill bytes, stack frame and shared
  memory per kernel) and the cubin is read back with `cuobjdump -sass` (the width of every
  global load, the matrix instructions used).
- Triton kernels report what Triton's compiled kernel objects carry once they have run on a GPU
  (`n_regs`, `n_spills`, `metadata.shared`, `metadata.num_warps`) and the PTX Triton emitted (the
  width of every global load, the matrix instructions): read in the process, where running
  cuobjdump on the cubin took a third of a small candidate's time on an H200 (bench/NOTES.md,
  2026-12-05, 11:50-12:10 UTC). Under the Triton interpreter nothing is compiled, and the
  report says so.
"""

from __future__ import annotations

import dataclasses
import functools
import re
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

from core.evaluate.static_rules import check_candidate
from core.runtime.cuda import wrap_source

NVCC_ARCH = "sm_90"
CUDA_BIN = Path("/usr/local/cuda/bin")
INTERPRETER_NOTE = ("Triton interpreter: nothing was compiled, so there are no registers, spills "
                    "or shared memory to report")
# SASS opcodes of the matrix (tensor-core) instructions: warp-level MMA up to Ampere, warpgroup
# GMMA (PTX wgmma) on Hopper.
MATRIX_OPCODES = frozenset({"HMMA", "IMMA", "DMMA", "BMMA", "HGMMA", "IGMMA", "QGMMA", "BGMMA"})
# Global loads: plain, asynchronous into shared memory (cp.async), and bulk tensor copies (TMA).
LOAD_OPCODES = frozenset({"LDG", "LDGSTS"})
BULK_LOAD_OPCODES = frozenset({"UTMALDG", "UBLKCP"})
WIDTH_MODIFIERS = {"128": 16, "64": 8, "U16": 2, "S16": 2, "U8": 1, "S8": 1}
WIDE_LOAD_BYTES = 16
NOTE_CHARS = 2000  # of a compiler's error output kept in a note

_PTXAS_ENTRY = re.compile(r"Compiling entry function '([^']+)'")
_PTXAS_PROPERTIES = re.compile(r"Function properties for (\S+)")
_PTXAS_FRAME = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, "
                          r"(\d+) bytes spill loads")
_PTXAS_USED = re.compile(r"Used (\d+) registers")
_PTXAS_SMEM = re.compile(r"(\d+) bytes smem")
# PTX of global loads (`ld.global.v4.b32`, `cp.async.cg.shared.global [..], [..], 16`, bulk and
# tensor copies) and matrix instructions (`mma.sync...`, `wgmma.mma_async...`).
PTX_TYPE_BYTES = {**dict.fromkeys(("b8", "u8", "s8"), 1),
                  **dict.fromkeys(("b16", "u16", "s16", "f16", "bf16"), 2),
                  **dict.fromkeys(("b32", "u32", "s32", "f32"), 4),
                  **dict.fromkeys(("b64", "u64", "s64", "f64"), 8), "b128": 16}
_PTX_ENTRY = re.compile(r"^\s*(?:\.visible\s+)?\.entry\s+(\w+)")
_PTX_INSTRUCTION = re.compile(r"^\s*(?:@!?%\w+\s+)?([a-z][\w.:]*)(.*)")
_PTX_COPY_SIZE = re.compile(r"\]\s*,\s*(0x[0-9a-fA-F]+|\d+)")
_SASS_FUNCTION = re.compile(r"^\s*Function : (\S+)")
_SASS_INSTRUCTION = re.compile(r"^\s*/\*[0-9a-f]+\*/\s+(?:@!?\w+\s+)?([A-Z][A-Z0-9_]*(?:\.\w+)*)")


@dataclass
class KernelStats:
    """One compiled kernel. None: the figure is not known for this kernel (see `sources`)."""

    name: str
    registers: int | None = None  # per thread
    spill_store_bytes: int | None = None  # per thread, as ptxas counts them
    spill_load_bytes: int | None = None
    stack_bytes: int | None = None  # local memory per thread: spills and local arrays
    shared_bytes: int | None = None  # static shared memory per block
    threads: int | None = None  # per block, when fixed at compile time (Triton's warps × 32)
    wide_loads: int | None = None  # global load instructions moving 16 bytes (or bulk copies)
    narrow_loads: int | None = None  # global load instructions moving fewer bytes
    matrix_ops: list[str] = field(default_factory=list)  # distinct opcodes, e.g. HMMA.16816.F32
    sources: dict[str, str] = field(default_factory=dict)  # figure → where it was read

    @property
    def local_bytes(self) -> int:
        """Bytes per thread that live in (slow, off-chip) local memory or move through it."""
        return max(self.stack_bytes or 0, (self.spill_store_bytes or 0)
                   + (self.spill_load_bytes or 0))


@dataclass
class KernelReport:
    """Every compiled kernel of one candidate, and why figures are missing where they are."""

    kernels: list[KernelStats] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @staticmethod
    def from_dict(record: dict[str, Any]) -> KernelReport:
        return KernelReport([KernelStats(**kernel) for kernel in record.get("kernels", [])],
                            list(record.get("notes", [])))

    def largest(self, figure: str) -> int | None:
        """The largest known value of a figure over the kernels; None when none knows it."""
        known = [value for kernel in self.kernels
                 if (value := getattr(kernel, figure)) is not None]
        return max(known) if known else None

    def loads_known(self) -> bool:
        return any(kernel.wide_loads is not None for kernel in self.kernels)


def parse_ptxas(log: str) -> dict[str, KernelStats]:
    """Entry kernels' registers, spills, stack frame and shared memory from `ptxas -v` output."""
    kernels: dict[str, KernelStats] = {}
    frames: dict[str, tuple[int, int, int]] = {}
    entry = properties = None
    for line in log.splitlines():
        if found := _PTXAS_ENTRY.search(line):
            entry = found[1]
            kernels[entry] = KernelStats(entry)
        elif found := _PTXAS_PROPERTIES.search(line):
            properties = found[1]
        elif (found := _PTXAS_FRAME.search(line)) and properties is not None:
            frames[properties] = (int(found[1]), int(found[2]), int(found[3]))
        elif (found := _PTXAS_USED.search(line)) and entry is not None:
            kernels[entry].registers = int(found[1])
            smem = _PTXAS_SMEM.search(line)
            kernels[entry].shared_bytes = int(smem[1]) if smem else 0
    for name, kernel in kernels.items():
        kernel.stack_bytes, kernel.spill_store_bytes, kernel.spill_load_bytes = frames.get(
            name, (0, 0, 0))
    return kernels


def _count_instructions(text: str, header: re.Pattern[str],
                        classify: Callable[[str], int | str | None]
                        ) -> dict[str, tuple[int, int, list[str]]]:
    """Per function of a listing (`header` names it): wide and narrow global loads and matrix
    opcodes, as `classify` reads each line: the bytes a load moves (0 for a bulk copy, wide
    whatever its size), a matrix opcode, or None."""
    found: dict[str, tuple[int, int, set[str]]] = {}
    name = None
    for line in text.splitlines():
        if match := header.match(line):
            name = match[1]
            found[name] = (0, 0, set())
            continue
        if name is None or (kind := classify(line)) is None:
            continue
        wide, narrow, matrix = found[name]
        if isinstance(kind, str):
            matrix.add(kind)
        elif kind == 0 or kind >= WIDE_LOAD_BYTES:
            wide += 1
        else:
            narrow += 1
        found[name] = (wide, narrow, matrix)
    return {name: (wide, narrow, sorted(matrix)) for name, (wide, narrow, matrix) in found.items()}


def _sass_instruction(line: str) -> int | str | None:
    instruction = _SASS_INSTRUCTION.match(line)
    if instruction is None:
        return None
    opcode = instruction[1]
    root, *modifiers = opcode.split(".")
    if root in BULK_LOAD_OPCODES:
        return 0
    if root in LOAD_OPCODES:
        return next((WIDTH_MODIFIERS[m] for m in modifiers if m in WIDTH_MODIFIERS), 4)
    return opcode if root in MATRIX_OPCODES else None


def _ptx_instruction(line: str) -> int | str | None:
    instruction = _PTX_INSTRUCTION.match(line)
    if instruction is None:
        return None
    opcode, operands = instruction[1], instruction[2]
    parts = opcode.split(".")
    if parts[:2] == ["cp", "async"]:
        if "bulk" in parts:
            return 0 if any(p.startswith("global") for p in parts) else None
        size = _PTX_COPY_SIZE.search(operands)
        return int(size[1], 0) if size and "global" in parts else None
    if parts[:2] == ["ld", "global"]:
        vector = next((int(p[1:]) for p in parts if re.fullmatch(r"v\d+", p)), 1)
        element = next((PTX_TYPE_BYTES[p] for p in reversed(parts) if p in PTX_TYPE_BYTES), 4)
        return vector * element
    return opcode if opcode.startswith(("mma.", "wgmma.mma_async.")) else None


def parse_sass(sass: str) -> dict[str, tuple[int, int, list[str]]]:
    """Per function in `cuobjdump -sass` output: wide and narrow global loads, matrix opcodes."""
    return _count_instructions(sass, _SASS_FUNCTION, _sass_instruction)


def parse_ptx(ptx: str) -> dict[str, tuple[int, int, list[str]]]:
    """Per entry function of Triton's PTX: wide and narrow global loads, matrix opcodes."""
    return _count_instructions(ptx, _PTX_ENTRY, _ptx_instruction)


def find_tool(name: str) -> str:
    """nvcc or cuobjdump: on PATH, in the CUDA toolkit, or (cuobjdump) the copy Triton ships."""
    found = shutil.which(name)
    if found:
        return found
    if (CUDA_BIN / name).exists():
        return str(CUDA_BIN / name)
    if name == "cuobjdump":
        from triton import knobs

        return knobs.nvidia.cuobjdump.path
    raise FileNotFoundError(f"{name} not found on PATH or in {CUDA_BIN}")


def read_sass(cubin: Path) -> str:
    result = subprocess.run([find_tool("cuobjdump"), "-sass", str(cubin)], capture_output=True,
                            text=True, check=False)
    if result.returncode != 0:
        raise RuntimeError(f"cuobjdump -sass {cubin.name} failed: {result.stderr.strip()}")
    return result.stdout


def add_sass(kernels: dict[str, KernelStats], cubin: Path, where: str) -> str:
    """Load widths and matrix opcodes from the cubin's SASS; a note when it cannot be read."""
    try:
        sass = read_sass(cubin)
    except (FileNotFoundError, RuntimeError) as err:
        return f"no load widths or matrix opcodes: {err}"
    for name, (wide, narrow, matrix) in parse_sass(sass).items():
        if name in kernels:
            kernel = kernels[name]
            kernel.wide_loads, kernel.narrow_loads, kernel.matrix_ops = wide, narrow, matrix
            kernel.sources.update(loads=where, matrix_ops=where)
    return ""


@functools.lru_cache(maxsize=256)
def cuda_source_report(source: str) -> KernelReport:
    """Compile one CUDA source as the runtime helper wraps it; read ptxas's counts and the SASS."""
    ptxas = f"ptxas -v (nvcc -arch={NVCC_ARCH} --resource-usage)"
    try:
        nvcc = find_tool("nvcc")
    except FileNotFoundError as err:
        return KernelReport(notes=[f"no CUDA figures: {err}"])
    with tempfile.TemporaryDirectory(prefix="kiln-report-") as folder:
        path, cubin = Path(folder) / "kernel.cu", Path(folder) / "kernel.cubin"
        path.write_text(wrap_source(source))
        result = subprocess.run(
            [nvcc, f"-arch={NVCC_ARCH}", "-cubin", "--resource-usage", "-o", str(cubin),
             str(path)], capture_output=True, text=True, cwd=folder, check=False)
        log = result.stdout + result.stderr
        if result.returncode != 0:
            return KernelReport(notes=["nvcc failed, no CUDA figures:\n"
                                       + log.strip()[:NOTE_CHARS]])
        kernels = parse_ptxas(log)
        for kernel in kernels.values():
            kernel.sources.update(registers=ptxas, spills=ptxas, stack_bytes=ptxas,
                                  shared_bytes=ptxas)
        note = add_sass(kernels, cubin, "cuobjdump -sass")
    return KernelReport(list(kernels.values()), [note] if note else [])


def cuda_sources(candidate_source: str) -> list[str]:
    """The candidate's CUDA sources, found as the static check finds them (anchors play no part
    in that, so the problem's source is not needed)."""
    if "__global__" not in candidate_source:
        return []  # no CUDA, and no need to parse the source again
    return [text for _, text in check_candidate(candidate_source, "", tf32=True).cuda_sources]


def triton_kernels(module: ModuleType) -> list[Any]:
    """The module's Triton kernels (JIT or interpreted functions), unwrapped from autotuners."""
    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.jit import JITFunction, KernelInterface

    kernels = []
    for value in vars(module).values():
        while isinstance(value, KernelInterface) and not isinstance(
                value, JITFunction | InterpretedFunction):
            value = value.fn
        if isinstance(value, JITFunction | InterpretedFunction):
            kernels.append(value)
    return kernels


def compiled_triton_stats(compiled: Any) -> tuple[KernelStats, str]:
    """Figures of one compiled Triton kernel that has been loaded onto the GPU, and a note on
    what could not be read."""
    metadata = compiled.metadata
    kernel = KernelStats(
        compiled.name, registers=compiled.n_regs, stack_bytes=compiled.n_spills * 4,
        shared_bytes=metadata.shared, threads=metadata.num_warps * 32,
        sources={"registers": "Triton n_regs",
                 "stack_bytes": "Triton n_spills × 4 (the kernel's local memory per thread)",
                 "shared_bytes": "Triton metadata.shared",
                 "threads": "Triton metadata.num_warps × 32"})
    ptx = compiled.asm.get("ptx")
    if ptx is None:
        return kernel, f"{kernel.name}: Triton kept no PTX, so no load widths"
    found = parse_ptx(ptx).get(kernel.name)
    if found is None:
        return kernel, f"{kernel.name}: its PTX has no entry of that name, so no load widths"
    kernel.wide_loads, kernel.narrow_loads, kernel.matrix_ops = found
    kernel.sources.update(loads="Triton's PTX", matrix_ops="Triton's PTX")
    return kernel, ""


def triton_report(module: ModuleType) -> KernelReport:
    from triton.runtime.jit import JITFunction

    report = KernelReport()
    seen: set[str] = set()
    for function in triton_kernels(module):
        if not isinstance(function, JITFunction):
            if INTERPRETER_NOTE not in report.notes:
                report.notes.append(INTERPRETER_NOTE)
            continue
        for kernel_cache, *_ in function.device_caches.values():
            for compiled in kernel_cache.values():
                # A kernel that was compiled but never launched has no figures yet.
                if compiled.hash in seen or compiled.module is None:
                    continue
                seen.add(compiled.hash)
                kernel, note = compiled_triton_stats(compiled)
                report.kernels.append(kernel)
                report.notes += [note] if note else []
    return report


def candidate_report(module: ModuleType, source: str) -> KernelReport:
    """Everything known about the kernels of a candidate that has run (its module, its source)."""
    return with_cuda_sources(triton_report(module), source)


def with_cuda_sources(report: KernelReport, source: str) -> KernelReport:
    """`report` (the Triton kernels', read where the candidate ran) with its CUDA sources'."""
    return with_cuda_report(report, cuda_sources_report(source))


def cuda_sources_report(source: str) -> KernelReport:
    """The figures of a candidate's CUDA sources, each compiled again by nvcc (a second or so
    of CPU work a source, which a judge starts beside the candidate's own build)."""
    found = KernelReport()
    for cuda in cuda_sources(source):
        with_cuda_report(found, cuda_source_report(cuda))
    return found


def with_cuda_report(report: KernelReport, cuda: KernelReport) -> KernelReport:
    """`report` (the Triton kernels', read where the candidate ran) with `cuda`'s."""
    report.kernels += cuda.kernels
    report.notes += cuda.notes
    return report
