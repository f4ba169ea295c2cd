"""How a planned kernel is laid out on the GPU: a separate object the search changes one setting at
a time.

A program takes `block_rows` rows and walks columns `block_columns` at a time, with `num_warps`
warps. When every loop of a row (each reduction's, the columns') fits in one block of columns, the
kernel is persistent: each row's values are loaded once and kept in registers from the first
reduction to the stores. With `splits` above one, that many programs share each row's loops: each
reduces its share into partial results, a launch per reduction level, and a last launch combines
them and writes the outputs, its columns shared the same way (for rows too few to fill the GPU,
a loss over a whole tensor, say). A kernel without reductions gives each program one block of
columns. With `resident_per_sm` above zero, that many programs per SM stride over the blocks of
rows instead of one program a block: a row walked twice (a norm's statistics, then its outputs)
is read the second time from L2, since only the rows in flight are ever in it. With
`cluster_blocks` (the CUDA tier, sm_90), that many blocks of a thread-block cluster share each
row's loops in one launch: each folds its share, the blocks send their partial results to each
other through distributed shared memory, and each goes on with the row's totals to its share of
the outputs. A row is then read by several SMs at once and done soon after, so that far fewer
rows are in flight than with a block a row, and a row's second walk finds it in L2. With
`keep_row` (CUDA), a block keeps its share of each row's inputs in shared memory from the first
walk to the last, which then read no memory at all. Rows too long for a cluster's shared memory
(a group norm's 8 MB groups) are shared by `grid_blocks` blocks anywhere on the GPU (CUDA): each
block writes its partial results to global memory and waits at a barrier of the row's blocks
before reading theirs, in one cooperative launch (every block resident at once, so that none
waits on one that never starts), the blocks striding over the rows a few at a time, as many an
SM as fit so that one row's blocks read while another's wait. With `vector` (CUDA), a lane takes
that many consecutive columns a step in a row's walks, each fp32 input and output lying along
them read and written as one 8- or 16-byte access.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from core.profile.roofline import GpuPeaks
from core.runtime.cuda import MAX_DYNAMIC_SHARED, SM_SHARED_BYTES
from generators.compiler.plan import Kernel
from generators.compiler.registers import HELD_VALUES, MAX_WARPS, fewest_register_threads

# Elements one program holds at once: more and a block spills its registers (a [rows, columns]
# tile of fp32 at 8 warps, 256 threads, 64 values a thread).
MAX_TILE = 16384
MAX_PERSISTENT_COLUMNS = 16384
# Elements a persistent program with short rows holds (8 warps, 16 values a thread).
ROWS_TILE = 4096
# Rows side by side held whole take tiles of up to SIDE_TILE values, at least MIN_SIDE_ROWS rows
# (64 bytes of a column a warp's load): the tile that ran a softmax over channels at 95 % of the
# byte floor (bench/NOTES.md, the rules generator's second table).
SIDE_TILE = 8192
MIN_SIDE_ROWS = 16
# Fewer rows than this leave an H200's 132 SMs idle unless their loops are split; a loop this
# long is worth a launch of its own per reduction level.
FEW_ROWS = 512
SPLIT_LOOP = 1 << 16
# A launch of rows side by side whose blocks of rows give the SMs fewer programs than
# SPLIT_BELOW_PER_SM each splits its rows' loops, for FILL_PER_SM an SM: an amax over the first
# dimension of an 8192² matrix so split came level with the best kernel there, 7 % behind unsplit
# in 64 or 128 blocks; a sum over dim 1 in 512 blocks (3.9 an SM) ran 4 % slower split than not
# (bench/NOTES.md, 2026-12-06, 23:20 UTC, and 2026-12-07, 01:53 UTC).
SPLIT_BELOW_PER_SM = 2
FILL_PER_SM = 4
# Rows held whole longer than this also get a draft of RESIDENT_ROWS_PER_SM programs an SM
# striding over them, each pass's loads issued while the last pass stores: the row writer's
# persistent schedule (its kernels led the compiler's on softmax and layer_norm: bench/NOTES.md,
# round of 2026-12-07 00:17 UTC).
RESIDENT_ROWS_FROM = 1024
RESIDENT_ROWS_PER_SM = 4
# Columns a step of the tall draft for rows side by side, on rows longer than that.
TALL_COLUMNS = 256
# The most programs a launch's second grid dimension takes (CUDA's limit on gridDim.y): past
# it, each program walks several blocks of its row's columns.
MAX_SPLITS = 65535


HELD_IN = {"shared": "shared memory", "registers": "registers"}


@dataclass(frozen=True)
class Schedule:
    block_rows: int = 1
    block_columns: int = 1024
    num_warps: int = 4
    splits: int = 1  # programs sharing each row's loops
    resident_per_sm: int = 0  # programs per SM striding over the blocks; 0: one a block
    cluster_blocks: int = 0  # blocks of a cluster sharing each row's loops (CUDA); 0: none
    keep_row: bool = False  # a row's inputs kept on chip between its walks (CUDA)
    held: str = "shared"  # where kept inputs live: "shared" memory or "registers"
    # Blocks anywhere on the GPU sharing each row's loops in one launch, exchanging partial
    # results through global memory (CUDA, a cooperative launch); 0: none.
    grid_blocks: int = 0
    # Consecutive columns a thread takes at a time in a row's walks, loaded and stored as one
    # vector where an input or output lies along them (CUDA); 1: a column at a time.
    vector: int = 1
    # How the site's convolution is computed (`generators.compiler.library.CONVOLUTIONS`): cuDNN
    # on its input as laid out (""), cuDNN on "channels_last" input, or Kiln's implicit GEMM
    # ("gemm", Triton). It changes the kernels' program.
    library_layout: str = ""

    def describe(self) -> str:
        return (f"{self.block_rows} row(s) x {self.block_columns} columns a block, "
                f"{self.num_warps} warps" + (f", each row's loops split over {self.splits} "
                                             "programs" if self.splits > 1 else "")
                + (f", {self.resident_per_sm} program(s) per SM striding over the blocks"
                   if self.resident_per_sm else "")
                + (f", each row shared by a cluster of {self.cluster_blocks} blocks"
                   if self.cluster_blocks else "")
                + (f", each row shared by {self.grid_blocks} blocks of the GPU meeting at a "
                   "barrier in global memory" if self.grid_blocks else "")
                + (f", each row's inputs kept in {HELD_IN[self.held]} between its walks"
                   if self.keep_row else "")
                + (f", {self.vector} columns a thread at a time" if self.vector > 1 else "")
                + (", the convolution as Kiln's implicit GEMM" if self.library_layout == "gemm"
                   else f", the library's convolution on {self.library_layout.replace('_', '-')} "
                   "input" if self.library_layout else ""))

    def fitted(self, kernel: Kernel) -> Schedule:
        """This schedule within the kernel's sizes: no more rows a block than the kernel has
        (one, when no dimension is a row one), no more splits than blocks of a loop. A cluster
        shares the loops of a reduction kernel's rows (not a scan's, whose total crosses the
        row), in place of splits and of striding blocks; so do a row's blocks of the GPU, a row
        a block, one block an SM or more, striding over the rows. Vectors of columns only where
        they fit the kernel (`vectors_fit`), so that settings it cannot take write the same
        kernel as without them."""
        rows = min(self.block_rows, _pow2(kernel.row_count))
        loop = kernel.longest_loop
        vector = self.vector if self.vector > 1 and vectors_fit(kernel, self.vector) else 1
        keep = (self.keep_row and kernel.walks_rows_twice() and kernel.scan_dim is None
                and not kernel.rows_contiguous())
        shared_rows = kernel.reductions and kernel.scan_dim is None
        if self.grid_blocks and shared_rows:
            return replace(self, block_rows=1, splits=1, cluster_blocks=0,
                           resident_per_sm=max(1, self.resident_per_sm), keep_row=keep,
                           held=self.held if keep else "shared", vector=vector)
        if self.cluster_blocks and shared_rows:
            return replace(self, block_rows=rows, splits=1, resident_per_sm=0, keep_row=keep,
                           held=self.held if keep else "shared", grid_blocks=0, vector=vector)
        splits = max(1, min(self.splits, -(-loop // self.block_columns)))
        # Split launches end a row's walk at each level: nothing to keep between them.
        keep = keep and splits == 1
        return replace(self, block_rows=rows, splits=splits, cluster_blocks=0, keep_row=keep,
                       held=self.held if keep else "shared", grid_blocks=0, vector=vector)

    def persistent(self, kernel: Kernel) -> bool:
        """Every loop of a row fits in one block of columns, and one program does them."""
        return kernel.longest_loop <= self.block_columns and self.split_count(kernel) == 1

    def split_count(self, kernel: Kernel) -> int:
        """Programs sharing a row: the schedule's splits for reductions (one for scans, whose
        running total crosses the whole row), one block of columns each without them."""
        if kernel.scan_dim is not None:
            return 1
        if kernel.reductions:
            return self.cluster_blocks or self.grid_blocks or min(self.splits, MAX_SPLITS)
        blocks = max(1, -(-kernel.column_count // self.block_columns))
        # Past the grid's limit each program walks the same number of blocks, and only as many
        # programs as that takes are launched (none left with nothing but masked blocks).
        return -(-blocks // -(-blocks // MAX_SPLITS))


def vectors_fit(kernel: Kernel, width: int) -> bool:
    """Whether a reduction kernel's walks can take `width` columns a thread at a time: rows
    apart in memory (side by side, a warp's loads are one run already), no scan, and some walk
    (over the row's columns, or a reduction's loop) whose innermost dimension is a multiple of
    `width`, so that no vector spans two of its runs."""
    innermost = [kernel.sizes[r.walked[-1]] for r in kernel.reductions if r.loop]
    if kernel.columns:
        innermost.append(kernel.domain[kernel.columns[-1]])
    return bool(kernel.reductions and kernel.scan_dim is None and not kernel.rows_contiguous()
                and any(size % width == 0 for size in innermost))


def row_tile_width(columns: int, tile: int) -> int:
    """The columns of a tile of `tile` elements over rows of `columns`: the widest power of two
    that pads a row by at most an eighth (56 × 56 maps: 256, not 1024, which pads by 31 %), else
    the row's own power of two (7 × 7 maps: every width pads by 15)."""
    width = min(_pow2(columns), tile)
    while width > 32 and -(-columns // width) * width - columns > columns // 8:
        width //= 2
    if -(-columns // width) * width - columns > columns // 8:
        width = min(_pow2(columns), tile)
    return width


def _pow2(n: int) -> int:
    return 1 << max(0, math.ceil(math.log2(max(n, 1))))


def drafts(kernel: Kernel) -> list[tuple[Schedule, str]]:
    """First schedules to try, from the kernel's shape, each with why."""
    loop = kernel.longest_loop
    rows = kernel.row_count
    if not kernel.reductions and kernel.scan_dim is None:
        if kernel.rows and kernel.rows_contiguous():
            # Rows side by side in memory (a channels-last convolution's output): square tiles,
            # read along the rows and written along the columns, each in runs of whole lines.
            return [(Schedule(32, 64, 4), "elementwise over rows side by side: 32 rows read "
                                          "along memory × 64 columns written along it, 4 warps"),
                    (Schedule(64, 64, 8), "elementwise over rows side by side: 64 × 64 tiles, "
                                          "8 warps")]
        if kernel.rows:
            # Rows of a broadcast input (a conv output's channels): tiles of whole rows where
            # they are short, of parts of a row where they are long.
            in_rows = []
            for tile, warps in ((1024, 4), (4096, 8)):
                width = row_tile_width(kernel.column_count, tile)
                in_rows.append((Schedule(tile // width, width, warps),
                                f"elementwise in rows of {kernel.column_count}, each row's "
                                f"broadcast values loaded once: {tile // width} row(s) × {width} "
                                f"columns a program, {warps} warps"))
            return in_rows
        return [(Schedule(1, 1024, 4), "elementwise: 1024 elements a program, 4 warps"),
                (Schedule(1, 4096, 8), "elementwise: 4096 elements a program, 8 warps")]
    if rows < FEW_ROWS and loop >= SPLIT_LOOP:
        splits = max(2, min(FEW_ROWS // max(rows, 1), loop // SPLIT_LOOP))
        return [(Schedule(1, 4096, 8, splits), f"{rows} row(s) of {loop} values: each row's "
                                               f"loops split over {splits} programs"),
                (Schedule(1, 2048, 4, splits * 2), f"{rows} row(s) of {loop} values: split "
                                                   f"over {splits * 2} programs")]
    if not kernel.rows_contiguous():
        if loop <= MAX_PERSISTENT_COLUMNS:
            columns = _pow2(loop)
            # Short loops (a pooling window, a small softmax) take more rows, so that a
            # program still holds about ROWS_TILE elements.
            block_rows = max(1, min(_pow2(rows), MAX_TILE // columns,
                                    max(16, ROWS_TILE // columns)))
            warps = 8 if columns * block_rows >= 4096 else 4
            # A row a program: the row writer's warps, faster than 16 on softmax 8192²
            # (bench/NOTES.md, round of 2026-12-07 07:51 UTC).
            row_warps = 4 if columns <= 2048 else 8 if columns <= 8192 else 16
            persistent = [(Schedule(block_rows, columns, warps),
                           f"persistent: each row's {loop} values in registers, {block_rows} "
                           "row(s) a program"),
                          (Schedule(1, columns, row_warps), "persistent, one row a program")]
            if columns > RESIDENT_ROWS_FROM:
                persistent.append((
                    Schedule(1, columns, row_warps, resident_per_sm=RESIDENT_ROWS_PER_SM),
                    f"persistent, long rows of {loop}: {RESIDENT_ROWS_PER_SM} programs per SM "
                    f"striding over them, {row_warps} warps, the next row's loads in flight "
                    "while the last is stored"))
            return persistent
        looped = [(Schedule(1, 4096, 8), f"looped: rows of {loop} values walked 4096 at a time"),
                  (Schedule(1, 2048, 4), f"looped: rows of {loop} values walked 2048 at a time")]
        peaks = GpuPeaks()
        if (kernel.walks_rows_twice() and math.prod(kernel.domain) * 4 > peaks.l2_bytes
                and loop * 4 * peaks.sms <= peaks.l2_bytes):
            # One program a row puts hundreds of rows in flight, more than L2 holds: each row's
            # second walk went back to memory (bench/NOTES.md, 2026-12-06, 02:40-03:02 UTC).
            # A row a SM is all L2 need hold, where rows are short enough for that; measured
            # no faster than a program a row at 32768 rows of 65535 (same file, 05:10-05:37
            # UTC), it stays a draft for the search to rank beside the CUDA tier's clusters.
            looped.insert(0, (Schedule(1, 4096, 16, resident_per_sm=1),
                              f"looped: rows of {loop} values, one 16-warp program per SM "
                              "striding over them, so that a row's second walk finds it in L2"))
        return looped
    # The innermost dimension is a row one: a program takes many rows, side by side in memory.
    columns = min(_pow2(loop), 64)
    side = [(Schedule(64, max(1, min(columns, 32)), 4),
             "rows side by side: 64 rows a program read along memory, 32 columns a step"),
            (Schedule(128, max(1, min(columns, 16)), 8),
             "rows side by side: 128 rows a program, 16 columns a step, 8 warps")]
    if loop > TALL_COLUMNS:
        # Tall tiles: the fastest of a 36-setting ladder over a sum over dim 1 on an H200, and
        # the winner of a mean over dim 1 of 128 × 4096 × 4095 on an H100 (bench/NOTES.md,
        # sixth round; 2026-12-07, 01:53 UTC).
        side.append((Schedule(32, TALL_COLUMNS, 4),
                     f"rows side by side, tall: 32 rows a program (a 128-byte line of fp32), "
                     f"{TALL_COLUMNS} columns a step, 64 loads in flight a thread"))
    side = [_filling(kernel, schedule, why) for schedule, why in side]
    whole = _pow2(loop)
    if whole * MIN_SIDE_ROWS <= SIDE_TILE:
        # Short rows side by side (a softmax over channels) held whole: read once, not once a
        # walk (bench/NOTES.md, 2026-12-06, 23:20 UTC: softmax over dim 1 of 32 × 256 × 64²).
        block_rows = min(64, SIDE_TILE // whole)
        side.insert(0, (Schedule(block_rows, whole, 8),
                        f"persistent rows side by side: each row's {loop} values in registers, "
                        f"{block_rows} rows a program read along memory"))
    return side


def _filling(kernel: Kernel, schedule: Schedule, why: str) -> tuple[Schedule, str]:
    """`schedule` with its rows' loops split where its blocks of rows leave the GPU's SMs with
    fewer than SPLIT_BELOW_PER_SM programs each (an amax over the first dimension of a square
    matrix: 64 blocks of 128 columns), for FILL_PER_SM each, each split at least a block of
    columns long."""
    programs = -(-kernel.row_count // schedule.block_rows)
    sms = GpuPeaks().sms
    splits = min(-(-FILL_PER_SM * sms // programs), kernel.longest_loop // schedule.block_columns)
    if programs >= SPLIT_BELOW_PER_SM * sms or splits < 2:
        return schedule, why
    return (replace(schedule, splits=splits),
            f"{why}; {programs} blocks of rows, so each row's loops split over {splits} "
            "programs to fill the GPU")


# Blocks of a cluster that share a row, and the warps of each: 8 blocks (the most sm_90 takes
# portably) of 512 threads leave about 4 blocks an SM, so some 66 rows in flight on 132 SMs;
# each thread walks 8 columns a pass (4096 a block). Rows so long that an eighth of one would
# leave its block alone on its SM are shared by 16 first (`core.runtime.cuda` launches them).
CLUSTER_DRAFTS = ((8, 16), (4, 16))
WIDE_CLUSTER = 16
# The longest row one block keeps whole in shared memory: what it may take, in fp32, less a pass.
KEPT_ROW = MAX_DYNAMIC_SHARED // 4 - 4096
# Blocks of the GPU sharing a row too long for a cluster's shared memory: divisors of the 132 SMs
# of an H100 or H200, so that whole rows at a time fill it.
GRID_BLOCKS = (22, 33, 44, 66, 132)
# Columns a thread takes at a time in a row's walks on the CUDA tier: one 16-byte load of fp32,
# as the hand-written cluster norms load (bench/NOTES.md, 2026-12-06, 12:51-14:22 UTC: scalar
# loads left the compiled kept walks well behind them).
VECTOR = 4
# A block of a row shared over the GPU that shares its SM with others: 16 warps walking 8192
# columns a pass. Rows of 35_GroupNorm shared by 132 blocks, three an SM, ran faster than shared
# by 44 or 66 blocks alone on theirs, and than two an SM (bench/NOTES.md, 2026-12-06, 15:25 UTC).
SHARED_SM_PASS = 8192
# Shared memory a block takes beyond its kept share: its folds', and what the system reserves.
BLOCK_SHARED_EXTRA = 2048
# The threads an SM runs at once (sm_90).
SM_THREADS = 2048
# Columns a pass of a block alone on its SM keeping its share in shared memory: 16 a thread of
# 1024 (`generators.cuda.compiled.MAX_KEPT_STEPS` says why).
ALONE_PASS = 16 * 32 * MAX_WARPS


def cuda_drafts(kernel: Kernel) -> list[tuple[Schedule, str]]:
    """Schedules only the CUDA tier writes, for looped kernels that walk rows twice: each row
    kept on chip between its walks (in registers, or in shared memory), by one block where it
    fits, and (over an input larger than L2, whose rows in flight with a block a row do not fit
    in it) each row shared by a cluster of blocks, its inputs kept or read again from L2. The
    writer declines a share too large for registers or for shared memory."""
    loop = kernel.longest_loop
    if (kernel.scan_dim is not None or not kernel.walks_rows_twice()
            or kernel.rows_contiguous() or loop <= MAX_PERSISTENT_COLUMNS):
        return []
    found = _grid_drafts(loop)
    if loop <= KEPT_ROW:
        found += _held_twins(Schedule(1, 4096, 16, keep_row=True), loop,
                             f"rows of {loop} values, each kept in the {{held}} of a block of "
                             "{threads} threads from its first walk to its last: one read of "
                             "the inputs")
    if math.prod(kernel.domain) * 4 > GpuPeaks().l2_bytes:
        widest = ((WIDE_CLUSTER, 16),) if _alone(-(-loop // CLUSTER_DRAFTS[0][0])) else ()
        for blocks, warps in widest + CLUSTER_DRAFTS:
            shared = (f"rows of {loop} values, each shared by a cluster of {blocks} blocks of "
                      "{threads} threads that exchange their partial results")
            found += _held_twins(Schedule(1, 4096, warps, cluster_blocks=blocks, keep_row=True),
                                 -(-loop // blocks), f"{shared}, each block's share kept in its "
                                                     "{held}")
            found.append((Schedule(1, 4096, warps, cluster_blocks=blocks),
                          shared.format(threads=32 * warps) + ": few rows in flight, so that "
                          "a row's second walk finds it in L2"))
    return in_vectors(kernel, found)


def in_vectors(kernel: Kernel, found: list[tuple[Schedule, str]]) -> list[tuple[Schedule, str]]:
    """CUDA schedules `found` walking vectors of `VECTOR` columns, where they fit the kernel."""
    if not vectors_fit(kernel, VECTOR):
        return found
    return [(replace(s, vector=VECTOR), f"{why}; {VECTOR} columns a thread at a time, loaded "
             "as one vector") for s, why in found]


def _grid_drafts(loop: int) -> list[tuple[Schedule, str]]:
    """Rows whose share would not fit a block's shared memory even in a cluster of the most
    blocks: each shared by blocks of the whole GPU, those with the most blocks an SM first (each
    SM then holds blocks of several rows, so that one row's blocks read while another's wait at
    its barrier or write), then the fewest blocks a row."""
    if -(-loop // WIDE_CLUSTER) <= KEPT_ROW:
        return []
    sms = GpuPeaks().sms
    options = []
    for blocks in GRID_BLOCKS:
        share = -(-loop // blocks)
        if blocks > sms or share > KEPT_ROW:
            continue
        alone = _alone(share)
        warps, columns = (MAX_WARPS, ALONE_PASS) if alone else (16, SHARED_SM_PASS)
        kept = 4 * -(-share // columns) * columns
        per_sm = max(1, min(SM_SHARED_BYTES // (kept + BLOCK_SHARED_EXTRA),
                            SM_THREADS // (32 * warps)))
        options.append(Schedule(1, columns, warps, resident_per_sm=per_sm, keep_row=True,
                                grid_blocks=blocks))
    found = []
    for schedule in sorted(options, key=lambda s: (-s.resident_per_sm, s.grid_blocks))[:2]:
        per_sm, blocks = schedule.resident_per_sm, schedule.grid_blocks
        interleaved = ", one row's blocks reading while another's wait" if per_sm > 1 else ""
        found.append((schedule, f"rows of {loop} values, too long for a cluster's shared memory: "
                                f"each shared by {blocks} blocks of the GPU, {per_sm} an SM "
                                f"({per_sm * sms // blocks} rows at a time{interleaved}), each "
                                "keeping its share in shared memory, their partial results "
                                "meeting in global memory"))
    return found


def _held_twins(kept: Schedule, share: int, why: str) -> list[tuple[Schedule, str]]:
    """A kept schedule of `share` values a block with its inputs in shared memory, then in
    registers (every load of a share in flight at once), at each count of values a thread in
    `HELD_VALUES` by the fewest threads that hold it. A share in shared memory of more than
    half an SM's leaves its block alone on its SM, so that block takes every thread an SM runs,
    as many loads in flight as two blocks would have (bench/NOTES.md, round of 2026-12-06
    10:02 UTC: 23_Softmax's 196 KB shares)."""
    alone = _alone(share)
    twins = [replace(kept, held="shared", num_warps=MAX_WARPS if alone else kept.num_warps,
                     block_columns=ALONE_PASS if alone else kept.block_columns)]
    for values in HELD_VALUES:
        fewest = fewest_register_threads(share, values, VECTOR)
        if fewest is None:
            continue
        threads, held = fewest
        registers = replace(kept, held="registers", num_warps=threads // 32,
                            block_columns=held * threads)
        if registers not in twins:
            twins.append(registers)
    return [(s, why.format(held=HELD_IN[s.held], threads=32 * s.num_warps)) for s in twins]


def _alone(share: int) -> bool:
    """Whether a block keeping `share` fp32 values in shared memory is alone on its SM."""
    return share * 4 > SM_SHARED_BYTES // 2
