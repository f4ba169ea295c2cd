"""A site too tangled for one kernel, as a few kernels in a row with buffers between them.

When no domain computes a site in one kernel, it is because a reduction reads another over
other dimensions: a cross entropy averages, over the batch, losses that each needed a row's
log-softmax. The values those outer reductions reduce are then computed first, by kernels of
their own, into buffers; the rest of the site reads them as inputs. Each part is planned the
same way, so a part can split again.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from generators.compiler.ir import Graph, Input, Reduce, Value
from generators.compiler.plan import Kernel, plan
from generators.site_graph import Unsupported

MAX_KERNELS = 4


@dataclass
class Step:
    """One kernel: the buffers it reads, in its inputs' order, and those it writes."""

    kernel: Kernel
    reads: list[str]  # "in3" (the site's input 3) or "tmp0" (a buffer an earlier step wrote)
    writes: list[str]  # "out0" (the site's output 0) or "tmp0"


@dataclass
class Program:
    steps: list[Step]
    buffers: dict[str, Value]  # each temporary buffer, by name: its shape and dtype

    @property
    def calls_library(self) -> bool:
        """Whether the forward calls the vendor library before the kernels (a convolution)."""
        return any(value.call for value in self.steps[0].kernel.graph.inputs)


def _contains_reduction(value: Value, seen: set[int]) -> bool:
    if id(value) in seen:
        return False
    seen.add(id(value))
    return isinstance(value, Reduce) or any(_contains_reduction(o, seen)
                                            for o in value.operands())


# Where a site too tangled for one kernel is cut: at the sources of the outermost reductions that
# read others, at the sources of the innermost of them, or at the innermost reductions' own
# results (rows' statistics, read back by a kernel that recomputes what uses them).
CUTS = ("outermost", "innermost", "reductions")


def _cuts(graph: Graph, cut: str) -> list[Value]:
    """Where `cut` says to cut `graph`: the sources of the outermost reductions that read others
    (a loss averaging rows' log-softmaxes cuts at the rows' losses), the sources of the
    innermost ones (a logsumexp over the channels of a group norm's output cuts at that
    output, and its max and sum stay in one kernel), or the reductions those read (the group
    norm's statistics: the next kernel reads the norm's input again and never its output)."""
    cuts: list[Value] = []
    outer = [v for v in graph.values() if isinstance(v, Reduce)
             and _contains_reduction(v.source, set())]
    within = {id(v) for o in outer for v in _operand_closure(o.source) if isinstance(v, Reduce)}
    ids = {id(o) for o in outer}
    if cut == "reductions":
        for reduction in outer:
            for value in _operand_closure(reduction.source):
                if (isinstance(value, Reduce) and id(value) not in ids
                        and all(value is not c for c in cuts)):
                    cuts.append(value)
        return cuts
    for reduction in outer:
        if cut == "innermost":
            chosen = not any(id(v) in ids for v in _operand_closure(reduction.source))
        else:
            chosen = id(reduction) not in within
        if chosen and all(reduction.source is not c for c in cuts):
            cuts.append(reduction.source)
    return cuts


def _operand_closure(value: Value) -> list[Value]:
    found: dict[int, Value] = {}
    pending = [value]
    while pending:
        current = pending.pop()
        if id(current) not in found:
            found[id(current)] = current
            pending.extend(current.operands())
    return list(found.values())


def _replaced(graph: Graph, cuts: list[Value], first_index: int) -> Graph:
    """`graph` reading each cut value from a new input (numbered from `first_index`)."""
    inputs = list(graph.inputs)
    new: dict[int, Value] = {}
    for k, cut in enumerate(cuts):
        stride = tuple(_contiguous(cut.shape))
        buffer = Input(cut.shape, cut.dtype, index=first_index + k, stride=stride)
        inputs.append(buffer)
        new[id(cut)] = buffer

    def rebuilt(value: Value) -> Value:
        if id(value) in new:
            return new[id(value)]
        changes = {}
        for field in dataclasses.fields(value):
            current = getattr(value, field.name)
            if isinstance(current, Value):
                changes[field.name] = rebuilt(current)
            elif isinstance(current, tuple) and any(isinstance(a, Value) for a in current):
                changes[field.name] = tuple(
                    rebuilt(a) if isinstance(a, Value) else
                    (a[0], rebuilt(a[1])) if isinstance(a, tuple) and len(a) == 2 and
                    isinstance(a[1], Value) else a for a in current)
        new[id(value)] = dataclasses.replace(value, **changes) if changes else value
        return new[id(value)]

    return Graph(inputs, [rebuilt(o) for o in graph.outputs], graph.returns_tuple)


def _contiguous(shape: tuple[int, ...]) -> list[int]:
    strides, step = [], 1
    for size in reversed(shape):
        strides.append(step)
        step *= size
    return strides[::-1]


def plan_program(graph: Graph) -> Program:
    """The site as the fewest kernels any of the CUTS finds, then the fewest bytes of buffers
    between them; or Unsupported saying why not."""
    names = [f"in{v.index}" for v in graph.inputs]
    found: list[Program] = []
    reasons: list[Unsupported] = []
    for cut in CUTS:
        program = Program([], {})
        try:
            _plan_into(graph, names, [f"out{i}" for i in range(len(graph.outputs))], program,
                       cut)
        except Unsupported as reason:
            reasons.append(reason)
            continue
        found.append(program)
        if len(program.steps) == 1:
            break  # one kernel, no cut: the other cuts have nothing to better
    if not found:
        raise reasons[0]
    return min(found, key=lambda p: (len(p.steps), sum(v.numel * v.dtype.itemsize
                                                       for v in p.buffers.values())))


def _plan_into(graph: Graph, reads: list[str], writes: list[str], program: Program,
               cut: str) -> None:
    try:
        program.steps.append(Step(plan(graph), reads, writes))
        return
    except Unsupported as reason:
        cuts = _cuts(graph, cut)
        if not cuts or len(program.steps) + 2 > MAX_KERNELS:
            raise reason
    temps = []
    for cut in cuts:
        name = f"tmp{len(program.buffers)}"
        program.buffers[name] = cut
        temps.append(name)
    first = Graph(list(graph.inputs), list(cuts), returns_tuple=len(cuts) > 1)
    _plan_into(first, reads, temps, program, cut)
    # Values a buffer already holds (one written for the cuts' own kernels) are read from it,
    # not computed again.
    held = {id(value): name for name, value in program.buffers.items()}
    for value in graph.values():
        if id(value) in held and held[id(value)] not in temps:
            cuts.append(value)
            temps.append(held[id(value)])
    _plan_into(_replaced(graph, cuts, len(graph.inputs)), reads + temps, writes, program, cut)
