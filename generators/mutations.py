"""Turning a parent kernel's settings into its children's: one knob moved one step.

Each knob has an ordered ladder of values; a child moves one knob to a neighbouring rung.
The rationale says which knob moved, from what to what, and why that might pay. When the
parent carries a diagnosis, the steps that answer it come first.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace

from core.evaluate.diagnosis import (
    COMPUTE_BOUND,
    EXCESS_TRAFFIC,
    LATENCY_BOUND,
    NARROW_LOADS,
    REGISTER_LIMITED,
    SHARED_LIMITED,
    SPILLING,
    UNCOALESCED,
    diagnosis_code,
)
from generators.compiler.library import CONVOLUTIONS

# Ladders are powers of two because Triton block sizes must be; warps beyond 16 are not
# allowed and stages beyond 5 only add shared memory on Hopper.
LADDERS: dict[str, tuple[int | bool | str, ...]] = {
    "block": (128, 256, 512, 1024, 2048, 4096, 8192),
    "num_warps": (1, 2, 4, 8, 16),
    "num_stages": (1, 2, 3, 4, 5),
    "block_m": (16, 32, 64, 128, 256),
    "block_n": (16, 32, 64, 128, 256),
    "block_k": (16, 32, 64, 128),
    "group_m": (1, 4, 8, 16),
    "vector_bytes": (4, 8, 16),
    "blocks_per_sm": (1, 2, 4, 8, 16),
    "threads": (64, 128, 256, 512, 1024),
    "rows_per_block": (1, 2, 4, 8),
    "persistent": (False, True),
    "programs_per_sm": (1, 2, 4, 8),
    "cluster": (2, 4, 8),
    "vector": (1, 2, 4),
    "held": ("shared", "registers"),
    "block_rows": (1, 2, 4, 8, 16, 32, 64, 128),
    "block_columns": (8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384),
    "splits": (1, 2, 4, 8, 16, 32, 64, 128, 256, 512),
    # 0 (one program a block of rows) is the top rung: the most programs in flight.
    "resident_per_sm": (1, 2, 3, 4, 0),
    "cluster_blocks": (2, 4, 8, 16),
    "grid_blocks": (22, 33, 44, 66, 132),
    "keep_row": (False, True),
    # tf32 alone is no rung: it changes the answer, and is for runs that allow it.
    "precision": ("ieee", "tf32x3"),
    "library_layout": CONVOLUTIONS,
}
WHY_UP: dict[str, str | dict[object, str]] = {
    "block": "more elements per program, fewer programs to schedule",
    "num_warps": "more warps to hide memory latency",
    "num_stages": "deeper pipelining of loads",
    "block_m": "taller tiles reuse each B tile more",
    "block_n": "wider tiles reuse each A tile more",
    "block_k": "fewer K iterations",
    "group_m": "wider groups of programs share B tiles in L2",
    "vector_bytes": "wider loads move more bytes per instruction",
    "blocks_per_sm": "more resident blocks per SM to hide latency",
    "threads": "more threads per block in flight",
    "rows_per_block": "several rows per block amortize launch and reduction overhead",
    "persistent": "a few programs per SM loop over the rows, loading one block while the "
                  "previous one is stored",
    "programs_per_sm": "more programs per SM to hide memory latency",
    "cluster": "more blocks share a set: smaller shares of shared memory, more blocks per SM",
    "vector": "more values a thread step: wider loads, coordinates found once a vector",
    "held": "the share kept in registers: every load of it in flight at once, no trip "
            "through shared memory",
    "block_rows": "more rows a program: one launch and one fold for several rows",
    "block_columns": "wider column blocks: longer loads in flight, a row's loop in fewer steps",
    "splits": "more programs share each row's loops: more of the GPU for few, long rows",
    "resident_per_sm": "more programs in flight on each SM (0: one a block of rows) to hide "
                       "memory latency",
    "cluster_blocks": "more blocks of a cluster share each row: fewer rows in flight, so that a "
                      "row's second walk finds it in L2",
    "grid_blocks": "more blocks of the GPU share each row: smaller shares, fewer rows at a "
                   "time",
    "keep_row": "a row's inputs kept on chip from its first walk: later walks read no memory",
    "precision": "fp32 products as three tf32 tensor-core products: fp32's accuracy at several "
                 "times the speed of fp32 arithmetic",
    "library_layout": {
        "channels_last": "the convolution on channels-last input: cuDNN's NHWC kernels, and its "
                         "output read along the channels",
        "gemm": "the convolution as Kiln's implicit GEMM in Triton: tiles of all the output "
                "channels, no library call (slower than cuDNN on each convolution measured)"},
}
WHY_DOWN: dict[str, str | dict[object, str]] = {
    "block": "smaller blocks, more programs to fill every SM",
    "num_warps": "fewer warps, more registers each",
    "num_stages": "less shared memory, more occupancy",
    "block_m": "smaller tiles, more programs for small problems",
    "block_n": "smaller tiles, more programs for small problems",
    "block_k": "smaller K steps, fewer registers",
    "group_m": "narrower groups",
    "vector_bytes": "narrower loads, fewer registers",
    "blocks_per_sm": "fewer blocks, each looping over more of the grid",
    "threads": "fewer threads, more registers each",
    "rows_per_block": "fewer rows per block, more blocks",
    "persistent": "one program per block of rows, scheduled by the hardware",
    "programs_per_sm": "fewer programs per SM, each looping over more of the work",
    "cluster": "fewer blocks share a set: fewer cluster barriers and partial sums to merge",
    "vector": "fewer values a thread step: more threads in flight on each share",
    "held": "the share kept in shared memory: fewer registers a thread",
    "block_rows": "fewer rows a program: fewer registers, more programs",
    "block_columns": "narrower column blocks: fewer registers, a looped row instead of a "
                     "persistent one",
    "splits": "fewer programs a row: fewer partial results to write and combine",
    "resident_per_sm": "fewer programs in flight, striding over the rows: fewer rows in L2 at "
                       "once, so that a row's second walk reads it there",
    "cluster_blocks": "fewer blocks of a cluster share each row: fewer partial results to "
                      "exchange, more rows under way at once",
    "grid_blocks": "fewer blocks share each row: fewer partial results to exchange, more "
                   "rows under way at once to hide each row's barrier",
    "keep_row": "a row's walks read memory again: no shared memory or registers held, more "
                "blocks an SM",
    "precision": "exact fp32 products on the CUDA cores: no split operands held in registers",
    "library_layout": {
        "": "the convolution on its input as given: no conversion, its output laid out as the "
            "site's",
        "channels_last": "the convolution by cuDNN again, on channels-last input"},
}


# The steps each diagnosis (`core.evaluate.diagnosis`) asks for first, as (knob, +1 up / -1 down),
# most direct first. Spills and register-bound occupancy: fewer values live per thread (smaller
# tiles, fewer rows, narrower vectors, more warps sharing one Triton block, or a share in shared
# memory instead of registers). Shared memory: fewer stages and smaller tiles, or the share in
# registers. Too little in flight: more work per program and more programs, or every load of a share
# issued at once from registers. Narrow loads and uncoalesced access: wider vectors, wider tiles
# along the contiguous dimension. Compute-bound: larger matrix tiles that reuse each load more, more
# warps to issue the math. Excess traffic: larger matrix tiles (each operand is read fewer times),
# fewer partial results.
_FEWER_REGISTERS = (("block", -1), ("rows_per_block", -1),
                    ("block_columns", -1), ("block_rows", -1), ("block_m", -1), ("block_n", -1),
                    ("block_k", -1), ("num_warps", 1), ("vector_bytes", -1), ("num_stages", -1),
                    ("held", -1))
PREFERRED: dict[str, tuple[tuple[str, int], ...]] = {
    SPILLING: _FEWER_REGISTERS,
    REGISTER_LIMITED: _FEWER_REGISTERS,
    SHARED_LIMITED: (("num_stages", -1), ("block_k", -1), ("block_m", -1), ("block_n", -1),
                     ("rows_per_block", -1), ("held", 1), ("keep_row", -1)),
    LATENCY_BOUND: (("block", 1), ("block_rows", 1), ("rows_per_block", 1), ("num_stages", 1),
                    ("persistent", 1), ("blocks_per_sm", 1), ("programs_per_sm", 1),
                    ("num_warps", 1), ("threads", 1), ("held", 1), ("splits", 1),
                    ("block_columns", 1), ("resident_per_sm", 1)),
    NARROW_LOADS: (("vector_bytes", 1), ("block", 1)),
    UNCOALESCED: (("vector_bytes", 1), ("block", 1)),
    COMPUTE_BOUND: (("block_m", 1), ("block_n", 1), ("num_warps", 1), ("threads", 1)),
    EXCESS_TRAFFIC: (("block_m", 1), ("block_n", 1), ("rows_per_block", 1),
                     ("splits", -1), ("resident_per_sm", -1), ("cluster_blocks", 1),
                     ("keep_row", 1)),
}


@dataclass(frozen=True)
class Step:
    settings: object
    rationale: str
    knob: str = ""
    direction: int = 0  # +1 one rung up the knob's ladder, -1 one rung down


def neighbours(settings: object) -> list[Step]:
    """Every settings dataclass one rung away on one ladder, in field order, up before down."""
    steps: list[Step] = []
    for knob in fields(settings):
        ladder = LADDERS.get(knob.name)
        current = getattr(settings, knob.name)
        if ladder is None or current not in ladder:
            continue
        rung = ladder.index(current)
        for offset, why in ((1, WHY_UP), (-1, WHY_DOWN)):
            if 0 <= rung + offset < len(ladder):
                value = ladder[rung + offset]
                reason = why[knob.name]  # one for the knob, or one for each value it moves to
                reason = reason[value] if isinstance(reason, dict) else reason
                steps.append(Step(replace(settings, **{knob.name: value}),
                                  f"{knob.name} {current}→{value}: {reason}",
                                  knob.name, offset))
    return steps


def diagnosed_neighbours(settings: object, diagnosis: str) -> list[Step]:
    """`neighbours`, the steps the parent's diagnosis asks for first (in the order it asks for
    them, each saying so), then the rest in their usual order."""
    code = diagnosis_code(diagnosis)
    wanted = PREFERRED.get(code, ())
    steps = neighbours(settings)
    by_move = {(step.knob, step.direction): step for step in steps}
    first = [replace(by_move[move], rationale=f"{by_move[move].rationale} (the parent: {code})")
             for move in wanted if move in by_move]
    return first + [step for step in steps if (step.knob, step.direction) not in wanted]
