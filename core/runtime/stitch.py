"""Running a model with each site's call sites replaced by a module or an operator.

The backend re-partitions every graph it is given (the same deterministic cut as the
capture), looks each region's site key up in `replacements` and calls the replacement in the
region's place; regions without one run their original ops. A replacement is either an
`nn.Module` called with the region's inputs (with the site problems' own `Model`s this checks
that the sites plus the ops kept with PyTorch reproduce the model), or an operator taking the
list of the region's input tensors and returning the list of its outputs (a `torch.library`
custom op, opaque to a compiler the rest of the graph is handed to: how winning kernels are
installed).
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Mapping

import torch
import torch.fx as fx
import torch.nn as nn

from .capture import copy_segment, rebuild
from .partition import partition
from .segments import Segment, segments
from .site_problem import CodegenError, region_key

Finish = Callable[[fx.GraphModule, list], Callable[..., object]]
Replacement = nn.Module | Callable
Lookup = Callable[[str | None, list[object]], Replacement | None]


def _tensor_inputs(nodes: list[fx.Node]) -> bool:
    return all(isinstance(n.meta.get("example_value"), torch.Tensor) for n in nodes)


def stitching_backend(replacements: Mapping[str, Replacement] | Lookup,
                      used: list[str] | None = None, finish: Finish | None = None
                      ) -> Callable[[fx.GraphModule, list], Callable[..., object]]:
    """A torch.compile backend calling `replacements[key]` for each region whose key is known.

    `replacements` may instead be a function of the key and the region's example inputs (as
    dynamo traced them), asked once per region: a module it returns is that region's alone,
    `None` keeps the region's ops. `used`, if given, collects the keys of the regions that
    were replaced. `finish(gm, example_inputs)` compiles the rebuilt graph (e.g. inductor's
    `compile_fx`); without it the graph runs as it is.
    """

    lookup = ((lambda key, _: replacements.get(key)) if isinstance(replacements, Mapping)
              else replacements)

    def backend(gm: fx.GraphModule, example_inputs: list) -> Callable[..., object]:
        regions = partition(gm.graph)
        installed: dict[str, nn.Module] = {}

        def emit(graph: fx.Graph, segment: Segment, env: dict[fx.Node, fx.Node]) -> None:
            region = segment.region
            try:
                key = region_key(region) if region is not None else None
            except CodegenError:
                key = None
            replacement = None if region is None else lookup(
                key, [n.meta.get("example_value") for n in region.inputs])
            is_module = isinstance(replacement, nn.Module)
            if replacement is None or not (is_module or _tensor_inputs(region.inputs)):
                copy_segment(graph, segment, env)
                return
            if used is not None:
                used.append(key)
            inputs = [env[n] for n in region.inputs]
            if is_module:
                name = f"kiln_site_{len(installed)}"
                installed[name] = replacement
                call = graph.call_module(name, tuple(inputs))
                if len(region.outputs) == 1:
                    env[region.outputs[0]] = call
                    return
            else:
                call = graph.call_function(replacement, (inputs,))
            for i, node in enumerate(region.outputs):
                env[node] = graph.call_function(operator.getitem, (call, i))

        rebuilt = rebuild(gm, segments(gm.graph, regions), emit, installed)
        return rebuilt if finish is None else finish(rebuilt, example_inputs)

    return backend
