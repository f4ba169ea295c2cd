"""The graph a generator writes kernels from, read back from a site problem file.

A site problem is its own source of truth: it is captured through the same torch.compile
backend as the model it came from and partitioned the same way, so it must come back as one
region. Its ops, argument structure and tensor layouts are what generators see.
"""

from __future__ import annotations

import inspect
import re
from dataclasses import dataclass, replace
from pathlib import Path

import torch
import torch.fx as fx

from core.profile.load import import_file
from core.runtime.capture import Capture, capture
from core.runtime.ops import OpKind, op_info
from core.runtime.regions import Region


class Unsupported(Exception):
    """The generator cannot write kernels for this site; the message is the plain reason."""


@dataclass(frozen=True)
class TensorInfo:
    shape: tuple[int, ...]
    stride: tuple[int, ...]
    dtype: torch.dtype

    @property
    def numel(self) -> int:
        count = 1
        for size in self.shape:
            count *= size
        return count

    @staticmethod
    def of(value: torch.Tensor) -> TensorInfo:
        return TensorInfo(tuple(value.shape), tuple(value.stride()), value.dtype)


@dataclass(frozen=True)
class Ref:
    """A value inside the site: forward argument `index` if `is_input`, else op `index`."""

    index: int
    is_input: bool

    @property
    def name(self) -> str:
        return f"in{self.index}" if self.is_input else f"v{self.index}"


def holds_ref(value: object) -> bool:
    """Whether `value` is, or nests, a value of the site (not a constant)."""
    return isinstance(value, Ref) or (isinstance(value, tuple) and any(map(holds_ref, value)))


def constant_source(value: object, what: str) -> str:
    """The constant `value` written as Python; a site value in its place is Unsupported, as
    `what` (a setting that is a tensor)."""
    if holds_ref(value):
        raise Unsupported(what)
    return repr(value)


@dataclass(frozen=True)
class Op:
    name: str  # canonical op name (core.runtime.ops)
    kind: OpKind
    args: tuple[object, ...]  # Refs and constants, nested tuples kept
    kwargs: tuple[tuple[str, object], ...]
    out: TensorInfo

    def kwarg(self, key: str, default: object = None) -> object:
        return dict(self.kwargs).get(key, default)


@dataclass(frozen=True)
class SiteGraph:
    family: str
    inputs: tuple[TensorInfo, ...]
    ops: tuple[Op, ...]
    outputs: tuple[Ref, ...]  # in the order forward returns them
    returns_tuple: bool = False
    problem: Path | None = None  # the site problem it was read from

    def info(self, ref: Ref) -> TensorInfo:
        return self.inputs[ref.index] if ref.is_input else self.ops[ref.index].out


def _convert(value: object, refs: dict[fx.Node, Ref]) -> object:
    if isinstance(value, fx.Node):
        return refs[value]
    if isinstance(value, tuple | list | torch.Size):
        return tuple(_convert(v, refs) for v in value)
    return value


def graph_of_region(region: Region, arguments: dict[fx.Node, int],
                    inputs: tuple[TensorInfo, ...], returned: object) -> SiteGraph:
    """The region as a SiteGraph.

    `arguments` maps placeholders to forward argument indices; `returned` is the graph's
    output value (a node or a tuple of nodes), whose order the outputs follow.
    """
    refs = {node: Ref(i, True) for node, i in arguments.items()}
    missing = [n.name for n in region.inputs if n not in refs]
    if missing:
        raise Unsupported(f"the site reads values computed outside its region: {missing}")
    ops = []
    for i, node in enumerate(region.nodes):
        value = node.meta["example_value"]
        if isinstance(value, tuple | list):
            value = value[0]  # a tuple-valued reduction (max along a dim): its first result
        info = op_info(node)
        ops.append(Op(info.name, info.kind, _convert(tuple(node.args), refs),
                      tuple((k, _convert(v, refs)) for k, v in node.kwargs.items()),
                      TensorInfo.of(value)))
        refs[node] = Ref(i, False)
    nodes = returned if isinstance(returned, tuple | list) else (returned,)
    if any(n not in refs or refs[n].is_input for n in nodes):
        raise Unsupported("the problem returns something its ops did not compute")
    return SiteGraph(region.family, inputs, tuple(ops), tuple(refs[n] for n in nodes),
                     returns_tuple=isinstance(returned, tuple | list) and len(nodes) > 1)


def _capture_on_meta(model: torch.nn.Module, module: object) -> tuple[tuple, Capture]:
    """The problem's inputs and its captured graph, on meta tensors: the graph and the inputs'
    layouts are all the generator reads, and a problem's inputs can be gigabytes. A site whose
    ops need real values (a data-dependent size, say) is captured on inputs drawn on the CPU."""
    torch.manual_seed(0)
    with torch.device("meta"):
        inputs = tuple(module.get_inputs())
    try:
        return inputs, capture(model, inputs, torch.device("cpu"))
    except Exception:  # noqa: BLE001 - any failure on meta tensors: the real inputs decide
        torch.manual_seed(0)
        inputs = tuple(module.get_inputs())
        return inputs, capture(model, inputs, torch.device("cpu"))


def load_site_graph(problem: Path) -> SiteGraph:
    """Capture the problem's `Model` on its inputs and return its single region."""
    module = import_file(problem, f"kiln_site_{problem.parent.name.replace('-', '_')}")
    init = module.get_init_inputs() if hasattr(module, "get_init_inputs") else []
    if init:
        raise Unsupported("the problem's Model takes init arguments; the rules generator "
                          "writes kernels for stateless site problems")
    model = module.Model()
    if any(True for _ in model.parameters()):
        raise Unsupported("the problem's Model has parameters; the rules generator writes "
                          "kernels for stateless site problems")
    inputs, captured = _capture_on_meta(model, module)
    if len(captured.graphs) != 1:
        raise Unsupported(f"the problem compiles to {len(captured.graphs)} graphs, not one")
    graph = captured.graphs[0]
    regions = [r for r in graph.regions if r.family != "other"]
    if len(regions) != 1 or len(graph.regions) != 1:
        families = ", ".join(r.family for r in graph.regions) or "nothing"
        raise Unsupported(f"the problem cuts into {len(graph.regions)} regions ({families}), "
                          "not one fusible site")
    names = list(inspect.signature(model.forward).parameters)
    arguments: dict[fx.Node, int] = {}
    for node in graph.module.graph.nodes:
        # Dynamo names the placeholder of forward argument `x` "L_x_".
        match = re.fullmatch(r"L_(\w+)_", str(node.target)) if node.op == "placeholder" else None
        if node.op == "placeholder" and (match is None or match[1] not in names):
            raise Unsupported(f"graph input {node.target} is not a forward argument")
        if match is not None:
            arguments[node] = names.index(match[1])
    infos = tuple(TensorInfo.of(x) for x in inputs)
    returned = graph.module.graph.output_node().args[0]
    if isinstance(returned, tuple | list) and len(returned) == 1:
        returned = returned[0]  # dynamo wraps a single result in a tuple
    return replace(graph_of_region(regions[0], arguments, infos, returned), problem=problem)
