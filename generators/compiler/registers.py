"""How many values a thread of a CUDA block keeps in registers: the fewest threads that hold a
share, and what ptxas is asked for so that the blocks an SM stay."""

from __future__ import annotations

from core.runtime.cuda import SM_REGISTERS

# Values a thread keeps in registers, each drafted by the fewest threads that hold a share so:
# the cluster norm writer ran group norm fastest at 64 and batch norm at 40 on an H200
# (bench/NOTES.md, eighth round).
HELD_VALUES = (64, 40)
# Registers a thread needs beside the values it keeps: the cluster norm writer's group norm
# kernel keeps 64 in 80 (bench/NOTES.md, round of 2026-12-06 23:20 UTC).
KERNEL_REGISTERS = 16
# The most warps a block runs (1024 threads).
MAX_WARPS = 32


def fewest_register_threads(share: int, most: int, vector: int) -> tuple[int, int] | None:
    """(threads, values a thread): the fewest threads, in pairs of warps and at least 128, that
    keep a block's `share` in registers at `most` values a thread or fewer, in steps of `vector`
    values; None where 1024 threads cannot."""
    threads = max(128, -(-share // (most * 64)) * 64)
    held = -(-share // (threads * vector)) * vector
    return (threads, held) if threads <= 32 * MAX_WARPS and held <= held_limit(threads) else None


def held_limit(threads: int) -> int:
    """Values a thread may keep in registers: at most 64, and 32 at 1024 threads, so that with
    the kernel's own registers a block stays within an SM's 64 K without spilling."""
    return min(64, 32 * 1024 // threads)


def blocks_keeping(threads: int, values: int) -> int:
    """The blocks an SM a kernel asks ptxas for when each of its `threads` keeps `values` in
    registers: as many as the SM's 64 K registers hold at `values` and `KERNEL_REGISTERS` more a
    thread. Without it ptxas may take registers that cost a block an SM (group norm's 8 × 128
    share: 96 against 80, bench/NOTES.md, round of 2026-12-06 23:20 UTC)."""
    return max(1, SM_REGISTERS // (threads * (values + KERNEL_REGISTERS)))
