"""Ordering a partitioned graph for running it: each region contiguous, kept ops between them."""

from __future__ import annotations

import heapq
from dataclasses import dataclass

import torch.fx as fx

from .regions import Region, is_mutation


@dataclass(frozen=True)
class Segment:
    """A run of consecutive nodes in a region-contiguous order: one region, or kept ops."""

    nodes: tuple[fx.Node, ...]
    region: Region | None


def segments(graph: fx.Graph, regions: list[Region]) -> list[Segment]:
    """The graph's compute nodes in an order where each region is contiguous.

    Regions and the kept nodes between them are contracted into units and sorted
    topologically, earliest original position first; convex regions make this a DAG.
    Placeholders, get_attr and the output node are not part of any segment.
    """
    order = {node: i for i, node in enumerate(graph.nodes)}
    unit_of: dict[fx.Node, int] = {}
    units: list[tuple[fx.Node, ...]] = []
    unit_region: list[Region | None] = []
    for region in regions:
        for node in region.nodes:
            unit_of[node] = len(units)
        units.append(tuple(region.nodes))
        unit_region.append(region)
    for node in graph.nodes:
        if node.op in ("call_function", "call_method", "call_module") and node not in unit_of:
            unit_of[node] = len(units)
            units.append((node,))
            unit_region.append(None)
    deps: list[set[int]] = [set() for _ in units]
    for index, nodes in enumerate(units):
        for node in nodes:
            for parent in node.all_input_nodes:
                if parent in unit_of and unit_of[parent] != index:
                    deps[index].add(unit_of[parent])
    for barrier in (n for n in graph.nodes if is_mutation(n)):
        # Keep every unit on its side of a mutation; the grower made no unit straddle one.
        here = unit_of[barrier]
        for index, nodes in enumerate(units):
            if index == here:
                continue
            if order[nodes[0]] < order[barrier]:
                deps[here].add(index)
            else:
                deps[index].add(here)
    dependents: list[list[int]] = [[] for _ in units]
    for index, needs in enumerate(deps):
        for need in needs:
            dependents[need].append(index)
    waiting = [len(d) for d in deps]
    ready = [(order[units[i][0]], i) for i in range(len(units)) if waiting[i] == 0]
    heapq.heapify(ready)
    result: list[Segment] = []
    while ready:
        _, index = heapq.heappop(ready)
        region = unit_region[index]
        if region is None and result and result[-1].region is None:
            result[-1] = Segment(result[-1].nodes + units[index], None)
        else:
            result.append(Segment(units[index], region))
        for child in dependents[index]:
            waiting[child] -= 1
            if waiting[child] == 0:
                heapq.heappush(ready, (order[units[child][0]], child))
    if sum(len(s.nodes) for s in result) != len(unit_of):
        raise RuntimeError("regions are not convex: the contracted graph has a cycle")
    return result
