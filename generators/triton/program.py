"""A compiled site's candidate source: its kernels in Triton (`generators.triton.compiled`), and
the `ModelNew` that checks its inputs' layouts, allocates its outputs and buffers, and launches
each kernel in turn."""

from __future__ import annotations

import math

from generators.compiler.program import Program
from generators.compiler.schedule import Schedule, drafts
from generators.compiler.site import program_of
from generators.site_graph import SiteGraph, Unsupported
from generators.triton.compiled import KernelWriter, levels_of
from generators.triton.expressions import with_jit_helpers
from generators.triton.values import PROD_HELPER

_SOURCE = '''"""Kiln rules kernel (triton, compiled): {ops}. {schedule}."""

import torch
import torch.nn as nn
import triton
import triton.language as tl

{helpers}
{kernels}

class ModelNew(nn.Module):
    def forward(self, {params}):
{checks}
{allocations}
{launches}
        return {returns}
'''
_TORCH_DTYPE = {"tl.int64": "torch.int64", "tl.float32": "torch.float32"}


def _main_step(program: Program) -> int:
    """The step the search's schedule is for: the one walking the most elements."""
    sizes = [math.prod(step.kernel.domain) for step in program.steps]
    return sizes.index(max(sizes))


def write_program(program: Program, schedule: Schedule, ops: str) -> str:
    """The candidate source. The largest kernel takes `schedule`; the others their first
    draft."""
    main = _main_step(program)
    kernels, launches, allocations = [], [], []
    first = program.steps[0].kernel.graph.inputs
    inputs = sorted({r for step in program.steps for r in step.reads if r.startswith("in")},
                    key=lambda r: int(r[2:]))
    outputs = sorted({w for step in program.steps for w in step.writes
                      if w.startswith("out")}, key=lambda w: int(w[3:]))
    device = f"{inputs[0]}.device"
    for name, value in program.buffers.items():
        allocations.append(f"{name} = torch.empty({tuple(value.shape)}, device={device}, "
                           f"dtype={value.dtype})")
    for k, step in enumerate(program.steps):
        kernel = step.kernel
        chosen = (schedule if k == main else drafts(kernel)[0][0]).fitted(kernel)
        splits = chosen.split_count(kernel)
        levels = levels_of(kernel) if splits > 1 and kernel.reductions else 0
        for i, value in enumerate(kernel.graph.outputs):
            if step.writes[i].startswith("out"):
                allocations.append(f"{step.writes[i]} = torch.empty({tuple(value.shape)}, "
                                   f"device={device}, dtype={value.dtype})")
        workspaces = []
        for slot in KernelWriter(kernel, chosen, 0).workspaces:
            name = f"ws{k}_{len(workspaces)}"
            workspaces.append(name)
            allocations.append(f"{name} = torch.empty(({kernel.row_count}, {splits}), "
                               f"device={device}, dtype={_TORCH_DTYPE[slot.dtype]})")
        for phase in range(levels + 1):
            writer = KernelWriter(kernel, chosen, phase)
            local = [f"in{v.index}" for v in kernel.graph.inputs] + [
                f"out{i}" for i in range(len(kernel.graph.outputs))] + [
                writer.workspace(s) for s in writer.workspaces]
            kernels.append("\n".join(
                ["@triton.jit", f"def site_kernel_{k}_{phase}({', '.join(local)}, "
                 "BLOCK_ROWS: tl.constexpr, BLOCK_COLUMNS: tl.constexpr):", *writer.body()])
                + "\n")
            arguments = step.reads + step.writes + workspaces
            launches.append(
                f"        site_kernel_{k}_{phase}[({-(-kernel.row_count // chosen.block_rows)}, "
                f"{splits})]({', '.join(arguments)}, BLOCK_ROWS={chosen.block_rows}, "
                f"BLOCK_COLUMNS={chosen.block_columns}, num_warps={chosen.num_warps})")
    source = with_jit_helpers("import triton.language as tl\n" + "\n\n".join(kernels))
    source = source.removeprefix("import triton.language as tl\n")
    checks = []
    for value in first:
        name = f"in{value.index}"
        shape, stride = tuple(value.shape), tuple(value.stride)
        checks.append(f"assert tuple({name}.shape) == {shape} and {name}.stride() == {stride}, "
                      f"\"the kernel was written for {name} of shape {shape} and strides "
                      f"{stride}\"")
    returns = outputs if program.steps[-1].kernel.graph.returns_tuple else outputs[:1]
    return _SOURCE.format(
        ops=ops, schedule=schedule.describe(), helpers=PROD_HELPER if "_times" in source else "",
        kernels=source, params=", ".join(f"in{v.index}" for v in first),
        checks="\n".join(" " * 8 + c for c in checks),
        allocations="\n".join(" " * 8 + a for a in allocations),
        launches="\n".join(launches), returns=", ".join(returns))


def write_compiled(graph: SiteGraph, schedule: Schedule) -> str:
    """The rules' writer for any pointwise or reduction site the compiler plans."""
    return write_program(program_of(graph), schedule, " → ".join(op.name for op in graph.ops))


def compiled_drafts(graph: SiteGraph) -> list[tuple[Schedule, str]]:
    """The schedules to try first (for the site's largest kernel); where the compiler cannot
    plan the site, one default whose writing says why."""
    try:
        program = program_of(graph)
    except Unsupported:
        return [(Schedule(), "the compiler's default schedule")]
    return drafts(program.steps[_main_step(program)].kernel)
