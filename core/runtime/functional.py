"""Making a captured graph more functional where nothing can tell the difference, before it is cut
into sites: operator methods become operators, values nothing uses are dropped, in-place ops on
fresh values go out of place."""

from __future__ import annotations

import torch.fx as fx

from .ops import DUNDER_OPERATORS, OpKind, op_info, out_of_place


def operators_as_functions(graph: fx.Graph) -> None:
    """Rewrite `a.__eq__(b)` and its kin (`call_method`) as `operator.eq(a, b)`, the form other
    torch versions record, so that one spelling of each operator reaches the partition."""
    for node in graph.nodes:
        if node.op != "call_method" or node.target not in DUNDER_OPERATORS or node.kwargs:
            continue
        function, swapped = DUNDER_OPERATORS[str(node.target)]
        node.op, node.target = "call_function", function
        if swapped:
            node.args = tuple(reversed(node.args))


def functionalize_inplace(graph: fx.Graph) -> None:
    """Turn in-place ops into out-of-place ones wherever nothing can observe the difference.

    Safe when the mutated value is a fresh result of a compute op in this graph (not an input,
    not a view of something else) and nothing reads it after the mutation.
    """
    position = {node: i for i, node in enumerate(graph.nodes)}
    for node in graph.nodes:
        if node.op not in ("call_function", "call_method"):
            continue
        info = op_info(node)
        if not info.inplace or info.kind is not OpKind.POINTWISE or not node.args:
            continue
        target = node.args[0]
        if not isinstance(target, fx.Node) or target.op not in ("call_function", "call_method"):
            continue
        producer = op_info(target)
        if producer.inplace or producer.kind in (OpKind.VIEW, OpKind.OTHER):
            continue
        if all(position[user] <= position[node] for user in target.users):
            out_of_place(node)


def drop_dead_values(graph: fx.Graph) -> None:
    """Remove the compute of values nothing uses (a model that drops a result it asked for, as
    ViT-style blocks drop MultiheadAttention's averaged weights): a site for it would be time
    spent on nothing, and inductor drops it too. Only ops Kiln knows stay pure when removed go:
    mutations and unknown calls stay."""

    def kept(node: fx.Node) -> bool:
        if node.op not in ("call_function", "call_method"):
            return True
        info = op_info(node)
        return (info.inplace or info.kind is OpKind.OTHER
                or (node.op == "call_function" and node.is_impure()))

    graph.eliminate_dead_code(is_impure_node=kept)
