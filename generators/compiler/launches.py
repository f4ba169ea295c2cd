"""What a compiled site's candidate does whatever language its kernels are in: the `ModelNew`
checks its inputs' layouts, calls the vendor library for what the compiler leaves to it (a
convolution), allocates outputs, buffers and workspaces, and launches each kernel of the
program in turn, a launch per reduction level when a kernel's loops are split.

The backends (`generators.triton.program`, `generators.cuda.program`) write the kernels and the
launch statements; the rest of the forward is written here, once.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from generators.codegen import SM_COUNT_LINE
from generators.compiler.plan import Kernel, Reduction, without_online_sums
from generators.compiler.program import Program
from generators.compiler.schedule import Schedule, drafts


@dataclass(frozen=True)
class Slot:
    """One accumulator of a reduction, and its workspace when the loops are split."""

    reduction: int
    name: str  # "total", "shifted", "squares", "best", "at", "peak"
    dtype: torch.dtype


def slots(reduction: Reduction) -> list[Slot]:
    kind, i = reduction.node.kind, reduction.index
    if reduction.online_of is not None:  # the max so far, and the sum of exp(x - it)
        return [Slot(i, "peak", torch.float32), Slot(i, "total", torch.float32)]
    if kind == "var":
        return [Slot(i, "shifted", torch.float32), Slot(i, "squares", torch.float32)]
    if kind in ("argmax", "argmin"):
        return [Slot(i, "best", torch.float32), Slot(i, "at", torch.int64)]
    integral = not reduction.node.dtype.is_floating_point and kind in ("sum", "prod")
    return [Slot(i, "total", torch.int64 if integral else torch.float32)]


def neutral_kind(reduction: Reduction, slot: Slot) -> str | None:
    """The reduction kind whose neutral value the accumulator `slot` starts from (an online
    sum's max starts as a max does); None: zero (indices, a variance's shifted sums)."""
    if slot.name in ("at", "shifted", "squares"):
        return None
    return "amax" if slot.name == "peak" else reduction.node.kind


def levels_of(kernel: Kernel) -> int:
    return 1 + max((r.level for r in kernel.reductions), default=-1)


def workspace_slots(kernel: Kernel, schedule: Schedule) -> list[Slot]:
    """The partial results split loops pass between launches, or a row's blocks of the GPU to
    each other past their barrier, one (rows, splits) tensor each (a cluster's blocks pass
    theirs through their shared memory instead)."""
    if schedule.split_count(kernel) > 1 and kernel.reductions and not schedule.cluster_blocks:
        return [s for r in kernel.reductions for s in slots(r)]
    return []


def split_launches(kernel: Kernel, schedule: Schedule) -> bool:
    """Whether the kernel takes a launch per reduction level, each passing its partial results
    to the next through the workspaces (a row's blocks of the GPU pass theirs within one)."""
    return bool(workspace_slots(kernel, schedule)) and not schedule.grid_blocks


@dataclass(frozen=True)
class Launch:
    """One kernel launch: step `step`'s phase `phase`, and the forward's tensors it takes
    (the kernel's inputs, outputs and workspaces, in that order)."""

    step: int
    phase: int
    kernel: Kernel
    schedule: Schedule
    arguments: tuple[str, ...]

    @property
    def name(self) -> str:
        return f"site_kernel_{self.step}_{self.phase}"

    @property
    def splits(self) -> int:
        return self.schedule.split_count(self.kernel)

    def blocks(self, rows_per_program: int) -> int:
        """The blocks of `rows_per_program` rows that cover the kernel's rows."""
        return -(-self.kernel.row_count // rows_per_program)

    def grid_rows(self, rows_per_program: int) -> str:
        """The launch's programs along the rows: one a block of `rows_per_program` rows, or,
        with `resident_per_sm`, at most that many per SM (`sms`, counted by the forward), each
        striding over the blocks."""
        blocks = self.blocks(rows_per_program)
        per_sm = self.schedule.resident_per_sm
        if self.schedule.grid_blocks:
            # Every block of a cooperative launch resident at once: rows at a time to fill it.
            return f"min({blocks}, max(1, {per_sm} * sms // {self.schedule.grid_blocks}))"
        return f"min({blocks}, {per_sm} * sms)" if per_sm else str(blocks)


@dataclass
class Frame:
    params: list[str]
    checks: list[str]  # statements of the forward, in order
    allocations: list[str]
    launches: list[Launch]
    returns: list[str]
    # The schedule the largest kernel runs: the one asked for, fitted to the kernel. A candidate
    # names this one, so that settings its kernels cannot take write the same source as
    # without them, which the generator knows it proposed before.
    schedule: Schedule


def main_step(program: Program) -> int:
    """The step the search's schedule is for: the one walking the most elements."""
    sizes = [math.prod(step.kernel.domain) for step in program.steps]
    return sizes.index(max(sizes))


def main_kernel(program: Program) -> Kernel:
    """The kernel of the step the search's schedule is for."""
    return program.steps[main_step(program)].kernel


def frame(program: Program, schedule: Schedule) -> Frame:
    """The forward around the kernels. The largest kernel takes `schedule`; the others their
    first draft."""
    main = main_step(program)
    first = program.steps[0].kernel.graph.inputs
    inputs = sorted({r for step in program.steps for r in step.reads if r.startswith("in")},
                    key=lambda r: int(r[2:]))
    outputs = sorted({w for step in program.steps for w in step.writes
                      if w.startswith("out")}, key=lambda w: int(w[3:]))
    device = f"{inputs[0]}.device"
    allocations = [f"{name} = torch.empty({tuple(value.shape)}, device={device}, "
                   f"dtype={value.dtype})" for name, value in program.buffers.items()]
    launches = []
    for k, step in enumerate(program.steps):
        kernel = step.kernel
        chosen = (schedule if k == main else drafts(kernel)[0][0]).fitted(kernel)
        if (chosen.keep_row and not chosen.grid_blocks) or chosen.persistent(kernel):
            # A row's blocks of the GPU keep the online sum: a second walk would cost them a
            # second barrier in global memory. A row held whole in registers is walked again
            # for nothing, and the exponentials of its sum are then its outputs' too.
            kernel = without_online_sums(kernel)
        for i, value in enumerate(kernel.graph.outputs):
            if step.writes[i].startswith("out"):
                allocations.append(f"{step.writes[i]} = torch.empty({tuple(value.shape)}, "
                                   f"device={device}, dtype={value.dtype})")
        workspaces = []
        for j, slot in enumerate(workspace_slots(kernel, chosen)):
            workspaces.append(f"ws{k}_{j}")
            allocations.append(f"ws{k}_{j} = torch.empty(({kernel.row_count}, "
                               f"{chosen.split_count(kernel)}), device={device}, "
                               f"dtype={slot.dtype})")
        if workspaces and chosen.grid_blocks:
            # A count a row of its blocks' arrivals at its barriers, from zero every call.
            workspaces.append(f"arrivals{k}")
            allocations.append(f"arrivals{k} = torch.zeros(({kernel.row_count},), "
                               f"device={device}, dtype=torch.int32)")
        phases = levels_of(kernel) if split_launches(kernel, chosen) else 0
        launches += [Launch(k, phase, kernel, chosen, tuple(step.reads + step.writes + workspaces))
                     for phase in range(phases + 1)]
    if any(launch.schedule.resident_per_sm for launch in launches):
        allocations += [f"device = {device}", SM_COUNT_LINE]
    checks = []
    for value in first:
        name = f"in{value.index}"
        if value.call:
            checks.append(f"{name} = {value.call}")
        shape, stride = tuple(value.shape), tuple(value.stride)
        checks.append(f"assert tuple({name}.shape) == {shape} and {name}.stride() == {stride}, "
                      f"\"the kernel was written for {name} of shape {shape} and strides "
                      f"{stride}\"")
    returns = outputs if program.steps[-1].kernel.graph.returns_tuple else outputs[:1]
    return Frame([f"in{v.index}" for v in first if not v.call], checks, allocations, launches,
                 returns, next(launch.schedule for launch in launches if launch.step == main))


def kernel_parameters(kernel: Kernel, workspaces: int) -> list[str]:
    """The names a kernel calls its tensors: in<i>, out<i>, ws<i>."""
    return ([f"in{v.index}" for v in kernel.graph.inputs]
            + [f"out{i}" for i in range(len(kernel.graph.outputs))]
            + [f"ws{j}" for j in range(workspaces)])


def schedule_drafts(program: Program) -> list[tuple[Schedule, str]]:
    """The schedules to try first, for the program's largest kernel."""
    return drafts(main_kernel(program))
