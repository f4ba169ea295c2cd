"""Capturing a model's graphs through a custom torch.compile backend.

The backend is called once per graph, so graph breaks and data-dependent Python (which defeat
`fx.symbolic_trace` and `torch.export`) are simply more graphs. Parameters and buffers arrive
as graph inputs. Each graph is partitioned into regions on arrival and rebuilt with each
region contiguous and a timing mark between segments, so the same compiled model serves both
the capture and the in-situ profile.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.fx as fx
import torch.nn as nn

from .partition import partition
from .regions import Region
from .segments import Segment, segments
from .tracing import set_tracing_rules


@dataclass
class Mark:
    """One timestamp: which graph, which segment boundary, and a CUDA event or a clock."""

    graph: int
    boundary: int
    event: torch.cuda.Event | None
    clock_ns: int


@dataclass
class Recorder:
    """Collects marks while `active`; marks cost nothing measurable while it is not."""

    device: torch.device
    active: bool = False
    marks: list[Mark] = field(default_factory=list)
    _events: list[torch.cuda.Event] = field(default_factory=list)  # reused across forwards

    def mark(self, graph: int, boundary: int) -> None:
        if not self.active:
            return
        if self.device.type == "cuda":
            if len(self._events) <= len(self.marks):
                self._events.append(torch.cuda.Event(enable_timing=True))
            event = self._events[len(self.marks)]
            event.record()
            self.marks.append(Mark(graph, boundary, event, 0))
        else:
            self.marks.append(Mark(graph, boundary, None, time.perf_counter_ns()))


class _MarkModule(nn.Module):
    def __init__(self, recorder: Recorder, graph: int, boundary: int) -> None:
        super().__init__()
        self.recorder, self.graph, self.boundary = recorder, graph, boundary

    def forward(self) -> None:
        self.recorder.mark(self.graph, self.boundary)


@dataclass(eq=False)
class CapturedGraph:
    index: int
    module: fx.GraphModule  # as captured (safe in-place ops made out-of-place)
    regions: list[Region]
    segments: list[Segment]
    calls: int = 0  # invocations per forward, as counted by `Capture.count_calls`
    invocations: int = 0  # invocations so far
    # The real inputs of its first call, until the sites' values are recorded from them.
    first_inputs: list | None = None


SegmentEmitter = Callable[[fx.Graph, Segment, dict[fx.Node, fx.Node]], None]


def copy_segment(graph: fx.Graph, segment: Segment, env: dict[fx.Node, fx.Node]) -> None:
    for node in segment.nodes:
        env[node] = graph.node_copy(node, env.__getitem__)


def rebuild(
    gm: fx.GraphModule,
    segs: list[Segment],
    emit: SegmentEmitter = copy_segment,
    modules: dict[str, nn.Module] | None = None,
    between: Callable[[fx.Graph, int], None] | None = None,
) -> fx.GraphModule:
    """A new GraphModule running `segs` in order; `emit` writes each segment's nodes.

    `between(graph, k)` may insert nodes at each segment boundary k (0 before the first
    segment, len(segs) after the last); `modules` become submodules callable from the graph.
    """
    graph = fx.Graph()
    env: dict[fx.Node, fx.Node] = {}
    for node in gm.graph.nodes:
        if node.op in ("placeholder", "get_attr"):
            env[node] = graph.node_copy(node, env.__getitem__)
    for k, segment in enumerate(segs):
        if between is not None:
            between(graph, k)
        emit(graph, segment, env)
    if between is not None:
        between(graph, len(segs))
    graph.output(fx.map_arg(gm.graph.output_node().args[0], env.__getitem__))
    for name, module in (modules or {}).items():  # read after `emit`, which may add to it
        gm.add_submodule(name, module)
    return fx.GraphModule(gm, graph)


def _clone(value: object) -> object:
    return value.detach().clone() if isinstance(value, torch.Tensor) else value


@dataclass
class Capture:
    graphs: list[CapturedGraph]
    recorder: Recorder
    compiled: Callable[..., object]  # the model running the rebuilt, marked graphs

    def count_calls(self, inputs: tuple) -> None:
        """Run one forward and count how often each graph is called in it."""
        before = {graph.index: graph.invocations for graph in self.graphs}
        with torch.no_grad():
            self.compiled(*inputs)
        for graph in self.graphs:  # a graph first compiled now started from zero
            graph.calls = graph.invocations - before.get(graph.index, 0)


def capture(model: nn.Module, inputs: tuple, device: torch.device) -> Capture:
    """Compile `model` with the capturing backend and run it once on `inputs`."""
    recorder = Recorder(device)
    graphs: list[CapturedGraph] = []

    def backend(gm: fx.GraphModule, example_inputs: list) -> Callable[..., object]:
        index = len(graphs)
        regions = partition(gm.graph)
        segs = segments(gm.graph, regions)
        record = CapturedGraph(index, gm, regions, segs)
        graphs.append(record)
        marks = {f"kiln_mark_{k}": _MarkModule(recorder, index, k) for k in range(len(segs) + 1)}

        def add_mark(graph: fx.Graph, k: int) -> None:
            graph.call_module(f"kiln_mark_{k}")

        marked = rebuild(gm, segs, modules=marks, between=add_mark)

        def run(*args: object) -> object:
            record.invocations += 1
            if record.invocations == 1:
                record.first_inputs = [_clone(a) for a in args]
            return marked(*args)

        return run

    torch._dynamo.reset()
    set_tracing_rules()
    compiled = torch.compile(model, backend=backend, dynamic=False)
    result = Capture(graphs, recorder, compiled)
    with torch.no_grad():
        compiled(*inputs)
    result.count_calls(inputs)
    return result


def record_values(graph: CapturedGraph, wanted: set[fx.Node]) -> dict[fx.Node, object]:
    """Values of `wanted` nodes when the graph runs on its first call's inputs."""
    if graph.first_inputs is None:
        raise RuntimeError(f"graph {graph.index} was compiled but never called")
    values: dict[fx.Node, object] = {}

    class _Recording(fx.Interpreter):
        def run_node(self, n: fx.Node) -> object:
            result = super().run_node(n)
            if n in wanted:
                values[n] = result
            return result

    with torch.no_grad():
        _Recording(graph.module).run(*graph.first_inputs)
    return values
