"""Running a model with each site's call sites replaced by a module of the caller's choice.

The backend re-partitions every graph it is given (the same deterministic cut as the
capture), looks each region's site key up in `modules` and calls that module in the region's
place; regions without a module run their original ops. With the site problems' own `Model`s
this checks that the sites plus the ops kept with PyTorch reproduce the model; with winning
kernels it is how they are installed.
"""

from __future__ import annotations

import operator
from collections.abc import Callable

import torch.fx as fx
import torch.nn as nn

from core.capture import copy_segment, rebuild
from core.partition import Segment, partition, segments
from core.site_problem import CodegenError, region_key


def stitching_backend(modules: dict[str, nn.Module], used: list[str] | None = None
                      ) -> Callable[[fx.GraphModule, list], Callable[..., object]]:
    """A torch.compile backend calling `modules[key]` for each region whose site key is known.

    `used`, if given, collects the keys of the regions that were replaced.
    """

    def backend(gm: fx.GraphModule, example_inputs: list) -> Callable[..., object]:
        regions = partition(gm.graph)
        installed: dict[str, nn.Module] = {}

        def emit(graph: fx.Graph, segment: Segment, env: dict[fx.Node, fx.Node]) -> None:
            region = segment.region
            try:
                key = region_key(region) if region is not None else None
            except CodegenError:
                key = None
            if key not in modules:
                copy_segment(graph, segment, env)
                return
            name = f"kiln_site_{len(installed)}"
            installed[name] = modules[key]
            if used is not None:
                used.append(key)
            call = graph.call_module(name, tuple(env[n] for n in region.inputs))
            if len(region.outputs) == 1:
                env[region.outputs[0]] = call
            else:
                for i, node in enumerate(region.outputs):
                    env[node] = graph.call_function(operator.getitem, (call, i))

        return rebuild(gm, segments(gm.graph, regions), emit, installed)

    return backend
