"""Why a kernel is slow, read from its kernel report, its timing and, when Nsight Compute could
read them, its hardware counters: one code and one line.

In order, the first rule that applies wins:
- near the byte floor: the kernel moves its bytes about as fast as the memory allows;
- spilling: values live in local memory (register spills, or a local array);
- uncoalesced access (counters): global loads use little of each 32-byte sector they fetch;
- register- or shared-memory-limited occupancy: too few warps fit on an SM;
- compute-bound (counters): the SM pipelines are busy while DRAM is not;
- excess memory traffic (counters): DRAM is busy, yet the time is far above the byte floor, so
  the kernel moves more bytes than the problem needs;
- narrow loads: no global load moves 16 bytes;
- latency-bound: far from the floor with none of the above, so too few bytes are in flight
  (with counters, the stall reasons that dominate say what the warps wait on).
The line carries the numbers behind the code, e.g. "memory-bound near floor: at 82% of the
byte floor (<time> ms, floor <floor> ms); 64 registers/thread, no spills".
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from core.evaluate.correctness import flatten
from core.evaluate.counters import CounterReport, KernelCounters
from core.evaluate.kernel_report import KernelReport, KernelStats
from core.profile.roofline import touched_bytes
from core.runtime.cuda import SM_SHARED_BYTES

# An H200 SM (compute capability 9.0): 65536 registers, at most 2048 threads (64 warps) and
# 32 blocks resident, 228 KB of shared memory of which the driver reserves 1 KB per block.
# Registers are handed out per warp in units of 256.
SM_REGISTERS = 65536
SM_WARPS = 2048 // 32
SM_BLOCKS = 32
SHARED_RESERVED_PER_BLOCK = 1024
REGISTER_UNIT_PER_WARP = 256

# torch.compile's own kernels on the streaming problems measured on the H200 sit well above
# three quarters of the byte floor (bench/NOTES.md, the rules generator, second table): from
# there on, the bytes move about as fast as they can.
NEAR_FLOOR = 0.75
# Keeping 4.3 TB/s busy through roughly 600 ns of load latency takes about 2.6 MB in flight,
# some 20 KB per SM over 132 SMs: half the SM's warps issuing one 16-byte load each (16 KB)
# barely get there, so fewer resident warps than half starve a memory-bound kernel.
LOW_OCCUPANCY = 0.5
# A fully coalesced load of 4-byte elements uses all 32 bytes of each sector it fetches; a
# stride-2 access uses half. Below half, most of the fetched bytes are thrown away.
LOW_SECTOR_USE_PCT = 50.0
# ncu's Speed Of Light section calls a unit the bottleneck from about 60% of its peak.
BUSY_PCT = 60.0

NEAR_FLOOR_CODE = "memory-bound near floor"
SPILLING = "spilling"
REGISTER_LIMITED = "register-limited occupancy"
SHARED_LIMITED = "shared-memory-limited occupancy"
NARROW_LOADS = "narrow loads"
LATENCY_BOUND = "latency-bound: too little work in flight"
UNCOALESCED = "uncoalesced access"
COMPUTE_BOUND = "compute-bound"
EXCESS_TRAFFIC = "excess memory traffic"
CODES = (NEAR_FLOOR_CODE, SPILLING, UNCOALESCED, REGISTER_LIMITED, SHARED_LIMITED,
         COMPUTE_BOUND, EXCESS_TRAFFIC, NARROW_LOADS, LATENCY_BOUND)


@dataclass(frozen=True)
class Diagnosis:
    code: str = ""  # one of CODES; empty when nothing can be said
    message: str = ""

    def __str__(self) -> str:
        return f"{self.code}: {self.message}" if self.code else ""


def diagnosis_code(line: str) -> str:
    """The code a stored diagnosis line starts with; empty for an empty or unknown line."""
    return next((code for code in CODES if line.startswith(code)), "")


@dataclass(frozen=True)
class Occupancy:
    warps: int  # resident warps per SM
    limiter: str  # "warps", "blocks", "registers" or "shared memory"

    @property
    def fraction(self) -> float:
        return self.warps / SM_WARPS


def occupancy(kernel: KernelStats) -> Occupancy | None:
    """Resident warps per SM and what limits them; None without a register count. Without a
    fixed block size (CUDA, chosen at launch) blocks are counted as single warps, so only the
    register limit is judged."""
    if kernel.registers is None:
        return None
    block_warps = max(1, (kernel.threads or 32) // 32)
    warp_registers = math.ceil(kernel.registers * 32 / REGISTER_UNIT_PER_WARP) \
        * REGISTER_UNIT_PER_WARP
    limits = {"warps": SM_WARPS,
              "registers": SM_REGISTERS // (warp_registers * block_warps) * block_warps}
    if kernel.threads:
        limits["blocks"] = SM_BLOCKS * block_warps
        if kernel.shared_bytes:
            per_block = kernel.shared_bytes + SHARED_RESERVED_PER_BLOCK
            limits["shared memory"] = SM_SHARED_BYTES // per_block * block_warps
    limiter = min(limits, key=lambda name: limits[name])
    return Occupancy(min(SM_WARPS, limits[limiter]), limiter)


def resources(report: KernelReport) -> str:
    """Registers and local memory in a few words: "64 registers/thread, no spills"."""
    registers = report.largest("registers")
    if registers is None:
        return "no compiled-kernel figures"
    local = max(kernel.local_bytes for kernel in report.kernels)
    return f"{registers} registers/thread, " + (
        f"{local} bytes of local memory" if local else "no spills")


def timing(latency_ms: float, floor_ms: float, baseline_ms: float | None) -> str:
    baseline = f", baseline {baseline_ms:.4f} ms" if baseline_ms else ""
    return (f"at {floor_ms / latency_ms:.0%} of the byte floor ({latency_ms:.4f} ms, floor "
            f"{floor_ms:.4f} ms{baseline})")


def spilling(report: KernelReport) -> str | None:
    spilled = [k for k in report.kernels if k.local_bytes]
    if not spilled:
        return None
    worst = max(spilled, key=lambda k: k.local_bytes)
    parts = []
    if worst.spill_store_bytes or worst.spill_load_bytes:
        parts.append(f"{worst.spill_store_bytes} bytes of spill stores and "
                     f"{worst.spill_load_bytes} of spill loads")
    if worst.stack_bytes:
        parts.append(f"a {worst.stack_bytes}-byte stack frame")
    at = f" at {worst.registers} registers" if worst.registers is not None else ""
    return f"{worst.name}: {' and '.join(parts)} per thread{at}"


def limited(report: KernelReport) -> tuple[str, str] | None:
    """The kernel whose registers or shared memory leave the fewest warps resident, when that
    is under LOW_OCCUPANCY."""
    found = [(k, o) for k in report.kernels if (o := occupancy(k)) is not None
             and o.limiter in ("registers", "shared memory") and o.fraction < LOW_OCCUPANCY]
    if not found:
        return None
    kernel, occ = min(found, key=lambda pair: pair[1].warps)
    cause = (f"{kernel.registers} registers/thread" if occ.limiter == "registers"
             else f"{kernel.shared_bytes} bytes of shared memory per block")
    block = f" in blocks of {kernel.threads} threads" if kernel.threads else ""
    code = REGISTER_LIMITED if occ.limiter == "registers" else SHARED_LIMITED
    return code, (f"{kernel.name}: {cause}{block} leave room for {occ.warps} of {SM_WARPS} "
                  f"warps per SM ({occ.fraction:.0%})")


def narrow_loads(report: KernelReport) -> str | None:
    read = [k for k in report.kernels if k.wide_loads is not None]
    narrow = sum(k.narrow_loads or 0 for k in read)
    if not read or narrow == 0 or any(k.wide_loads for k in read):
        return None
    return f"none of {narrow} global load instructions moves 16 bytes"


def measured(kernel: KernelCounters) -> str:
    """The counters in a few words: "DRAM 41%, SM 12% of peak, occupancy 38%, L2 hit 52%"."""
    parts = [f"{label} {value:.0f}%" for label, value in (
        ("DRAM", kernel.dram_pct), ("SM", kernel.sm_pct))
        if value is not None]
    text = (", ".join(parts) + " of peak") if parts else ""
    for label, value in (("achieved occupancy", kernel.achieved_occupancy_pct),
                         ("L2 hit", kernel.l2_hit_pct)):
        if value is not None:
            text += f", {label} {value:.0f}%"
    stalls = kernel.top_stalls(2)
    if stalls:
        text += "; warps stall most on " + " and ".join(
            f"{reason} ({share:.0%})" for reason, share in stalls)
    return f"{kernel.name[:60]}: {text.lstrip(', ')}"


def counter_rule(kernel: KernelCounters, latency_ms: float | None, floor_ms: float | None
                 ) -> tuple[str, str] | None:
    """Uncoalesced access, compute-bound or excess traffic, read from the counters."""
    if kernel.sector_use_pct is not None and kernel.sector_use_pct < LOW_SECTOR_USE_PCT:
        return UNCOALESCED, (f"global loads use {kernel.sector_use_pct:.0f}% of each 32-byte "
                             f"sector they fetch; {measured(kernel)}")
    dram, sm = kernel.dram_pct or 0.0, kernel.sm_pct or 0.0
    if sm >= BUSY_PCT and dram < BUSY_PCT:
        return COMPUTE_BOUND, f"the SM pipelines, not DRAM, are the limit; {measured(kernel)}"
    if dram >= BUSY_PCT and latency_ms and floor_ms:
        return EXCESS_TRAFFIC, (f"DRAM is busy, yet the kernel runs at "
                                f"{floor_ms / latency_ms:.0%} of the byte floor: it moves more "
                                f"bytes than the problem needs; {measured(kernel)}")
    return None


def diagnose(report: KernelReport | None, latency_ms: float | None, floor_ms: float | None,
             baseline_ms: float | None = None, counters: CounterReport | None = None
             ) -> Diagnosis:
    """The first rule that applies. Without a latency (not timed on a GPU) or a floor, only the
    report's and the counters' rules can; without a report, only the floor's; without counters
    (none asked for, or ncu could not read them), the rules that need them are skipped."""
    report = report or KernelReport()
    kernel = counters.dominant if counters is not None else None
    timed = bool(latency_ms and floor_ms)
    when = f"; {timing(latency_ms, floor_ms, baseline_ms)}" if timed else ""
    seen = f"; {measured(kernel)}" if kernel is not None else ""
    if timed and floor_ms / latency_ms >= NEAR_FLOOR:
        return Diagnosis(NEAR_FLOOR_CODE, f"{timing(latency_ms, floor_ms, baseline_ms)}; "
                                          f"{resources(report)}{seen}")
    if (spilled := spilling(report)) is not None:
        return Diagnosis(SPILLING, spilled + when)
    found = counter_rule(kernel, latency_ms, floor_ms) if kernel is not None else None
    if found is not None and found[0] == UNCOALESCED:
        return Diagnosis(found[0], found[1] + when)
    if (occupancy_limit := limited(report)) is not None:
        return Diagnosis(occupancy_limit[0], occupancy_limit[1] + when + seen)
    if found is not None:
        return Diagnosis(found[0], found[1] + when)
    if (narrow := narrow_loads(report)) is not None:
        return Diagnosis(NARROW_LOADS, f"{narrow}; {resources(report)}{when}{seen}")
    if timed or kernel is not None:
        where = timing(latency_ms, floor_ms, baseline_ms) if timed else "not timed on a GPU"
        return Diagnosis(LATENCY_BOUND, f"{where} with {resources(report)}{seen}")
    return Diagnosis()


def moved_bytes(inputs: Sequence[object], output: object) -> tuple[int, int]:
    """Bytes read (each input once, broadcast dimensions once) and written (each output once)."""
    read = sum(touched_bytes(t) for t in inputs if isinstance(t, torch.Tensor))
    written = sum(t.numel() * t.element_size() for t in flatten(output)
                  if isinstance(t, torch.Tensor))
    return read, written

