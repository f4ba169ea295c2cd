"""Regions of a captured graph and what partitioning asks of its nodes: shapes, dtypes, layout,
ancestry, mutation."""

from __future__ import annotations

import operator
from dataclasses import dataclass, field

import torch
import torch.fx as fx

from .ops import example_tensor, op_info


@dataclass(eq=False)
class Region:
    """A convex set of nodes of one graph, in graph order, with what flows in and out."""

    family: str
    nodes: list[fx.Node] = field(default_factory=list)
    inputs: list[fx.Node] = field(default_factory=list)  # values read from outside
    outputs: list[fx.Node] = field(default_factory=list)  # values used outside


def ancestors_of(graph: fx.Graph) -> dict[fx.Node, frozenset[fx.Node]]:
    result: dict[fx.Node, frozenset[fx.Node]] = {}
    for node in graph.nodes:
        acc: set[fx.Node] = set()
        for parent in node.all_input_nodes:
            acc.add(parent)
            acc |= result[parent]
        result[node] = frozenset(acc)
    return result


def contiguous(node: fx.Node) -> bool:
    value = example_tensor(node)
    return value is not None and value.is_contiguous()


def shape_of(node: fx.Node) -> tuple[int, ...] | None:
    value = example_tensor(node)
    return None if value is None else tuple(value.shape)


def dtype_of(node: fx.Node) -> torch.dtype | None:
    value = example_tensor(node)
    return None if value is None else value.dtype


def same_shape(a: fx.Node, b: fx.Node) -> bool:
    return shape_of(a) is not None and shape_of(a) == shape_of(b)


def is_mutation(node: fx.Node) -> bool:
    return node.op in ("call_function", "call_method") and op_info(node).inplace


def picks(node: fx.Node) -> bool:
    """Whether `node` picks one result of a tuple-valued op (max along a dim, say)."""
    parents = node.all_input_nodes
    return (node.op == "call_function" and node.target is operator.getitem and len(parents) == 1
            and isinstance(parents[0].meta.get("example_value"), tuple | list))


def seal(region: Region, order: dict[fx.Node, int]) -> None:
    region.nodes.sort(key=order.__getitem__)
    members = set(region.nodes)
    inputs: dict[fx.Node, None] = {}
    for node in region.nodes:
        for parent in node.all_input_nodes:
            if parent not in members:
                inputs.setdefault(parent)
    region.inputs = list(inputs)
    region.outputs = [n for n in region.nodes if any(u not in members for u in n.users)]
