"""A compiled site's candidate source in CUDA C++: its kernels (`generators.cuda.compiled`) inside
the forward every backend shares (`generators.compiler.launches`), compiled at construction with
`core.runtime.cuda`."""

from __future__ import annotations

from generators.compiler.launches import frame
from generators.compiler.program import Program
from generators.compiler.registers import blocks_keeping, held_limit
from generators.compiler.schedule import Schedule
from generators.compiler.site import program_of
from generators.cuda.cluster_shares import SHARED_LIMIT
from generators.cuda.compiled import CudaKernelWriter
from generators.cuda.expressions import HELPERS
from generators.cuda.folds import CLUSTER_EXCHANGE, FOLDS, GRID_EXCHANGE, VECTORS
from generators.site_graph import SiteGraph, Unsupported

_SOURCE = '''"""Kiln rules kernel (cuda, compiled): {ops}. {schedule}."""

import torch
import torch.nn as nn

from core.runtime.cuda import load_kernel

SOURCE = r"""{helpers}
{kernels}
"""


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.kernels = {{name: load_kernel(SOURCE, name, types, cooperative=cooperative)
                        for name, types, cooperative in {signatures}}}

    def forward(self, {params}):
{statements}
{launches}
        return {returns}
'''


def write_cuda_program(program: Program, schedule: Schedule, ops: str) -> str:
    """The candidate source; the largest kernel takes `schedule`, the others their first
    draft."""
    forward = frame(program, schedule)
    kernels, launches, signatures, clustered, gridded, vectored = [], [], [], False, False, False
    aligned: list[str] = []  # the forward's checks that its inputs take vector loads
    for launch in forward.launches:
        writer = CudaKernelWriter(launch.kernel, launch.schedule, launch.phase)
        body = writer.body()
        if writer.kept_bytes > SHARED_LIMIT:
            raise Unsupported(f"rows kept in shared memory take {writer.kept_bytes // 1024} KB "
                              f"a block, more than sm_90 has: share each row among more blocks")
        most = held_limit(writer.threads)
        if writer.kept_registers > most:
            raise Unsupported(f"rows kept in registers take {writer.kept_registers} values a "
                              f"thread, more than the {most} that stay in registers at "
                              f"{writer.threads} threads: keep them in shared memory, or share "
                              "each row among more blocks")
        parameters = ",\n    ".join(writer.parameter_types())
        vectored = vectored or writer.vector > 1
        for index in sorted(writer.vector_inputs):
            name, size = launch.arguments[index], 4 * writer.vector
            check = (f"assert {name}.data_ptr() % {size} == 0, \"the kernel loads {name} "
                     f"{writer.vector} values at a time: it takes a tensor at an address a "
                     f"multiple of {size} bytes\"")
            if name.startswith("in") and check not in aligned:
                aligned.append(check)
        clustered = clustered or bool(writer.cluster)
        gridded = gridded or bool(writer.grid)
        cluster = f" __cluster_dims__(1, {writer.cluster}, 1)" if writer.cluster else ""
        bounds = str(writer.threads)
        if writer.grid:
            # A cooperative launch needs every block resident at once: registers for that many.
            bounds += f", {launch.schedule.resident_per_sm}"
        elif writer.kept_registers:
            # Values kept in registers ask for the blocks an SM that fit beside them.
            bounds += f", {blocks_keeping(writer.threads, writer.kept_registers)}"
        kernels.append(f"__global__ void __launch_bounds__({bounds}){cluster} "
                       f"{launch.name}(\n    {parameters})\n{{\n" + "\n".join(body) + "\n}\n")
        signatures.append((launch.name, "P" * len(launch.arguments), bool(writer.grid)))
        blocks = launch.grid_rows(writer.rows_per_block)
        shared = f", shared_mem={writer.kept_bytes}" if writer.kept_bytes else ""
        launches.append(f"        self.kernels[{launch.name!r}](grid=({blocks}, {launch.splits}, "
                        f"1), block=({writer.threads}, 1, 1), args=("
                        f"{', '.join(launch.arguments)},){shared})")
    return _SOURCE.format(
        ops=ops, schedule=forward.schedule.describe(),
        helpers=HELPERS + FOLDS + (VECTORS if vectored else "")
        + (CLUSTER_EXCHANGE if clustered else "")
        + (GRID_EXCHANGE if gridded else ""),
        kernels="\n".join(kernels), signatures=tuple(signatures),
        params=", ".join(forward.params),
        statements="\n".join(" " * 8 + s for s in forward.checks + aligned
                              + forward.allocations),
        launches="\n".join(launches), returns=", ".join(forward.returns))


def write_cuda_compiled(graph: SiteGraph, schedule: Schedule) -> str:
    """The rules' CUDA writer for any pointwise or reduction site the compiler plans."""
    if schedule.library_layout == "gemm":
        raise Unsupported("Kiln's own convolution is a Triton kernel: the CUDA tier's kernels "
                          "follow cuDNN's")
    return write_cuda_program(program_of(graph, schedule.library_layout), schedule,
                              " → ".join(op.name for op in graph.ops))
