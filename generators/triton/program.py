"""A compiled site's candidate source in Triton: its kernels (`generators.triton.compiled`) inside
the forward every backend shares (`generators.compiler.launches`)."""

from __future__ import annotations

from dataclasses import replace
from itertools import zip_longest

from generators.compiler.launches import frame, kernel_parameters, schedule_drafts
from generators.compiler.program import Program
from generators.compiler.schedule import Schedule
from generators.compiler.site import program_of
from generators.site_graph import SiteGraph, Unsupported
from generators.triton.compiled import KernelWriter
from generators.triton.conv_gemm import CONVOLVE_SOURCE
from generators.triton.expressions import with_jit_helpers
from generators.triton.values import helpers_for

_SOURCE = '''"""Kiln rules kernel (triton, compiled): {ops}. {schedule}."""

import torch
import torch.nn as nn
import triton
import triton.language as tl

{helpers}
{kernels}

class ModelNew(nn.Module):
    def forward(self, {params}):
{statements}
{launches}
        return {returns}
'''


def write_program(program: Program, schedule: Schedule, ops: str) -> str:
    """The candidate source; the largest kernel takes `schedule`, the others their first
    draft."""
    if schedule.cluster_blocks or schedule.keep_row or schedule.grid_blocks:
        raise Unsupported("thread-block clusters, rows shared by blocks meeting at a barrier, "
                          "and rows kept in shared memory are the CUDA tier's: Triton kernels "
                          "share a row's loops through split launches and keep rows whole in "
                          "registers")
    if schedule.vector > 1:
        raise Unsupported("a vector width is the CUDA tier's: Triton vectorizes a block's "
                          "contiguous loads itself")
    forward = frame(program, schedule)
    kernels, launches = [], []
    for launch in forward.launches:
        chosen = launch.schedule
        writer = KernelWriter(launch.kernel, chosen, launch.phase)
        parameters = kernel_parameters(launch.kernel, len(writer.workspaces))
        strided = chosen.resident_per_sm > 0
        kernels.append("\n".join(
            ["@triton.jit", f"def {launch.name}({', '.join(parameters)}, "
             + ("PASSES: tl.constexpr, " if strided else "")
             + "BLOCK_ROWS: tl.constexpr, BLOCK_COLUMNS: tl.constexpr):", *writer.body()]) + "\n")
        programs = launch.grid_rows(chosen.block_rows)
        passes = (f"PASSES=-(-{launch.blocks(chosen.block_rows)} // {programs}), " if strided
                  else "")
        launches.append(
            f"        {launch.name}[({programs}, {launch.splits})]({', '.join(launch.arguments)}, "
            f"{passes}BLOCK_ROWS={chosen.block_rows}, BLOCK_COLUMNS={chosen.block_columns}, "
            f"num_warps={chosen.num_warps})")
    source = with_jit_helpers("import triton.language as tl\n" + "\n\n".join(kernels))
    source = source.removeprefix("import triton.language as tl\n")
    if schedule.library_layout == "gemm":
        source += CONVOLVE_SOURCE
    return _SOURCE.format(
        ops=ops, schedule=forward.schedule.describe(),
        helpers=helpers_for(source),
        kernels=source, params=", ".join(forward.params),
        statements="\n".join(" " * 8 + s for s in forward.checks + forward.allocations),
        launches="\n".join(launches), returns=", ".join(forward.returns))


def write_compiled(graph: SiteGraph, schedule: Schedule) -> str:
    """The rules' writer for any pointwise or reduction site the compiler plans."""
    return write_program(program_of(graph, schedule.library_layout), schedule,
                         " → ".join(op.name for op in graph.ops))


def compiled_drafts(graph: SiteGraph) -> list[tuple[Schedule, str]]:
    """The schedules to try first (for the site's largest kernel); where the compiler cannot
    plan the site, one default whose writing says why. A site calling the vendor library
    (a convolution) has each draft followed by its twin with the library's input
    channels-last, which cuDNN convolved faster in each conv of the development set
    (`generators.compiler.library`); the kernels after it ranked no better so far, on the
    three sites timed (bench/NOTES.md, 2026-12-07, 12:47-). Kiln's own convolution is no
    draft: it ran 4-6 times slower than cuDNN on each of level 2's (bench/NOTES.md,
    2026-12-07, 20:29-); a search reaches it one step from a channels-last draft."""
    try:
        program = program_of(graph)
    except Unsupported:
        return [(Schedule(), "the compiler's default schedule")]
    given = schedule_drafts(program)
    if not program.calls_library:
        return given
    try:
        laid = schedule_drafts(program_of(graph, "channels_last"))
    except Unsupported:
        return given
    twins = [(replace(schedule, library_layout="channels_last"),
              f"{why}; the convolution on channels-last input") for schedule, why in laid]
    return [draft for pair in zip_longest(given, twins) for draft in pair if draft is not None]
