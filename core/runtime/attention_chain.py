"""Attention written out, found in a captured graph: softmax(Q·Kᵀ (scaled, masked,
biased)) · V, or any elementwise weights of the scores in place of the softmax (ReLU attention),
claimed as one attention region before the partition grows the others.

GPT-2's eager attention (`w = q @ k^T; w = w / sqrt(d); w = torch.where(mask, w, min);
softmax(w, -1); dropout; w @ v`), a `masked_fill` of a causal mask, or an additive bias would
otherwise be cut into a matmul, a reduction and another matmul, the scores written out between.
"""

from __future__ import annotations

import torch
import torch.fx as fx

from .ops import OpKind, example_tensor, is_factory, make_relative, op_info

# Between the softmax and the second matmul of attention: identities in inference, and casts.
_PASS_THROUGH = frozenset("dropout identity detach contiguous to type type_as float half "
                          "bfloat16".split())
# Head dimensions a kernel holds a query's row of, and of its output, in registers.
MAX_HEAD_DIM = 256
# Ops that keep a value made of factories alone a constant (`torch.tril(torch.ones(t, t))`).
_CONSTANT_OPS = frozenset({"tril", "triu", "bool", "int", "long"})


def _names_device(values: object) -> bool:
    if isinstance(values, torch.device):
        return True
    if isinstance(values, tuple | list):
        return any(_names_device(v) for v in values)
    return isinstance(values, dict) and _names_device(list(values.values()))


def _constants(graph: fx.Graph) -> set[fx.Node]:
    """Tensors computed from factories alone: their values are fixed by the graph's code."""
    found: set[fx.Node] = set()
    for node in graph.nodes:
        if node.op not in ("call_function", "call_method") or example_tensor(node) is None:
            continue
        info = op_info(node)
        if is_factory(node) or (
                not info.inplace and node.all_input_nodes
                and all(p in found for p in node.all_input_nodes)
                and (info.kind in (OpKind.POINTWISE, OpKind.VIEW) or info.name in _CONSTANT_OPS)
                and not _names_device((node.args, node.kwargs))):
            found.add(node)
    return found


def _is_batched_matmul(node: fx.Node) -> bool:
    return (node.op in ("call_function", "call_method") and op_info(node).name in ("matmul", "bmm")
            and len(node.args) == 2 and not node.kwargs
            and all(example_tensor(a) is not None and example_tensor(a).dim() >= 2
                    for a in node.args))


def _transposed(node: object) -> bool:
    """Whether `node` is a Kᵀ: a view swapping the last two dimensions, or a value already laid
    out so (a site problem's input, drawn with the view's strides)."""
    value = example_tensor(node)
    if value is None or value.dim() < 2:
        return False
    name, rank = op_info(node).name, value.dim()
    if name in ("transpose", "swapaxes") and len(node.args) == 3:
        return {d % rank for d in node.args[1:]} == {rank - 2, rank - 1}
    if name == "permute":
        order = node.args[1] if isinstance(node.args[1], tuple | list) else node.args[1:]
        return [d % rank for d in order] == [*range(rank - 2), rank - 1, rank - 2]
    if name == "t":
        return rank == 2
    return value.stride(-2) == 1 and value.stride(-1) >= value.shape[-2] > 1


def _same_shape(a: object, b: object) -> bool:
    va, vb = example_tensor(a), example_tensor(b)
    return va is not None and vb is not None and va.shape == vb.shape


def _passes(node: fx.Node) -> bool:
    """An identity in inference, or a cast: `dropout` (eval), `to`, `type`, `float`, ..."""
    info = op_info(node)
    if info.name not in _PASS_THROUGH or info.inplace or not node.args:
        return False
    return (info.kind is not OpKind.OTHER or info.name == "type") and \
        _same_shape(node, node.args[0])


def _broadcasts_to(node: fx.Node, shape: torch.Size) -> bool:
    value = example_tensor(node)
    return value is not None and value.dim() <= len(shape) and all(
        a in (1, b) for a, b in zip(reversed(value.shape), reversed(shape), strict=False))


def _match_attention(softmax: fx.Node, ancestors: dict[fx.Node, frozenset[fx.Node]],
                     constants: set[fx.Node], order: dict[fx.Node, int]
                     ) -> tuple[set[fx.Node], fx.Node] | None:
    """softmax(scores)·V around `softmax`, as the nodes of one region and the scores' matmul.

    The scores are a batched matmul of Q and a transposed K; between it and a softmax over the
    last dimension only elementwise ops on the scores' shape, reading nothing but the scores,
    scalars, and masks or biases that broadcast to them; after it only identities and casts,
    then a matmul with V. No intermediate value is read elsewhere. Elementwise ops and
    constants that only the scores read come along.
    """
    info = op_info(softmax)
    logits = softmax.args[0] if softmax.args else None
    scores = example_tensor(logits)
    dim = softmax.kwargs.get("dim", softmax.args[1] if len(softmax.args) > 1 else None)
    if info.name != "softmax" or scores is None or not isinstance(dim, int) or \
            dim % scores.dim() != scores.dim() - 1:
        return None
    lineage = (ancestors[logits] | {logits}) - constants
    for first in sorted((n for n in lineage if _is_batched_matmul(n)), key=order.__getitem__):
        chain = {n for n in lineage if first in ancestors[n]}
        if all(op_info(n).kind is OpKind.POINTWISE or _passes(n) for n in chain):
            break
    else:
        return None
    nodes = {first, softmax, *chain}
    if not _transposed(first.args[1]) or not scores.is_floating_point() or any(
            example_tensor(n) is None or example_tensor(n).shape != scores.shape for n in chain):
        return None
    last, users = softmax, list(softmax.users)
    while len(users) == 1 and not _is_batched_matmul(users[0]) and _passes(users[0]) and \
            users[0].args[0] is last:
        last = users[0]
        nodes.add(last)
        users = list(last.users)
    second = users[0] if len(users) == 1 else None
    if second is None or not _is_batched_matmul(second) or second.args[0] is not last:
        return None
    return _with_values(first, second, nodes, chain, scores, ancestors, constants)


def _match_unnormalized(second: fx.Node, ancestors: dict[fx.Node, frozenset[fx.Node]],
                        constants: set[fx.Node], order: dict[fx.Node, int]
                        ) -> tuple[set[fx.Node], fx.Node] | None:
    """f(scores)·V with no softmax around the matmul `second` (ReLU or sigmoid attention): the
    weights are elementwise ops on Q·Kᵀ, read by nothing else. A query's row of Q and of the
    output stay in registers, so both are at most MAX_HEAD_DIM wide."""
    if not _is_batched_matmul(second):
        return None
    weights = second.args[0]
    lineage = (ancestors[weights] | {weights}) - constants
    for first in sorted((n for n in lineage if _is_batched_matmul(n)), key=order.__getitem__):
        chain = {n for n in lineage if first in ancestors[n]}
        if chain and all(op_info(n).kind is OpKind.POINTWISE or _passes(n) for n in chain):
            break
    else:
        return None
    scores, value = example_tensor(first), example_tensor(second.args[1])
    if scores is None or value is None or not _transposed(first.args[1]) or \
            not scores.is_floating_point() or \
            max(example_tensor(first.args[0]).shape[-1], value.shape[-1]) > MAX_HEAD_DIM or any(
            example_tensor(n) is None or example_tensor(n).shape != scores.shape for n in chain):
        return None
    return _with_values(first, second, {first, *chain}, chain, scores, ancestors, constants)


def _with_values(first: fx.Node, second: fx.Node, nodes: set[fx.Node], chain: set[fx.Node],
                 scores: torch.Tensor, ancestors: dict[fx.Node, frozenset[fx.Node]],
                 constants: set[fx.Node]) -> tuple[set[fx.Node], fx.Node] | None:
    """The claim completed by ·V, and the masks, biases and constants only the scores read; None
    when V comes from the scores or an intermediate value is read elsewhere."""
    value = second.args[1]
    if value in nodes or first in ancestors[value] or \
            example_tensor(second).shape[:-1] != scores.shape[:-1]:
        return None
    nodes.add(second)
    pending = [p for n in chain for p in n.all_input_nodes if p not in nodes]
    while pending:
        side = pending.pop()
        if side in nodes or not all(u in nodes for u in side.users) or \
                not _broadcasts_to(side, scores.shape):
            continue
        if side in constants:
            device = example_tensor(side).device == example_tensor(first).device
            # Constants move to just after the scores' matmul: read by the scores alone.
            if not device or any(u not in constants and first not in ancestors[u]
                                 for u in side.users):
                continue
        elif op_info(side).kind is not OpKind.POINTWISE:
            continue
        nodes.add(side)
        pending += [p for p in side.all_input_nodes if p not in nodes]
    if any(u not in nodes for n in nodes - {second} for u in n.users):
        return None  # an intermediate value read elsewhere: the scores are not private
    return nodes, first


def claim_attention(graph: fx.Graph, ancestors: dict[fx.Node, frozenset[fx.Node]]
                    ) -> list[set[fx.Node]]:
    """The node sets of attention written out (`_match_attention`), none spanning a mutation.

    Each set's constants become `new_*` factories of the scores and move to just after them,
    so that the site problem names no device and its mask is its own.
    """
    constants = _constants(graph)
    order = {node: i for i, node in enumerate(graph.nodes)}
    mutations = [order[n] for n in graph.nodes
                 if n.op in ("call_function", "call_method") and op_info(n).inplace]
    claims: list[set[fx.Node]] = []
    claimed: set[fx.Node] = set()
    for node in list(graph.nodes):
        if node.op not in ("call_function", "call_method") or node in claimed:
            continue
        if op_info(node).name == "softmax":
            found = _match_attention(node, ancestors, constants, order)
        else:
            found = _match_unnormalized(node, ancestors, constants, order)
        if found is None or found[0] & claimed:
            continue
        nodes, first = found
        span = [order[n] for n in nodes if n not in constants]
        if any(min(span) < m < max(span) for m in mutations):
            continue
        anchor = first
        for constant in sorted(nodes & constants, key=order.__getitem__):
            if is_factory(constant):  # a `new_*` too: its receiver may come after `first`
                make_relative(constant, first)
            anchor.append(constant)
            anchor = constant
        claims.append(nodes)
        claimed |= nodes
    return claims
