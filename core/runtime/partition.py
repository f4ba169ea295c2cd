"""Cutting a captured graph into regions: the fusible pieces that become sites.

A region is a convex set of nodes of one graph (no path leaves it and comes back), so it can be
replaced by a single call. Regions are grown greedily in graph order:
- attention written out, softmax(Q·Kᵀ (scaled, masked, biased)) · V, is claimed first as one
  attention region (`attention_chain`), as scaled_dot_product_attention is one;
- a matmul takes the elementwise chain that only computes its left operand (its prologue);
- matmul, conv and attention ops anchor a region and take the elementwise ops that follow them
  on their output's shape (the epilogue); a matmul also takes one reduction over its output's
  rows (sum, mean, max, min or logsumexp along the last dimension: each tile reduces its
  columns, a second pass combines the tiles) and the elementwise ops on the reduced values,
  and the norms and softmaxes its tiles can finish alone (`tile_norms`);
- a conv takes a reduction of its values too (a norm, softmax or sum), a second over a value of
  its output's size (a mean of a group norm's output), and what follows them;
- a reduction or norm anchors a region, swallows the pointwise chain of its input's shape that
  feeds it (the prologue; a value others read too becomes a second output; an epilogue of a
  conv it cannot join moves in too) and takes its epilogue, and a reduction over values of its
  input's size (a mean of a norm's output, never then written whole);
- remaining elementwise ops (inference-mode batch norm among them: a per-channel affine map)
  form maximal pointwise chains, across any broadcast;
- every other op with tensor inputs is a one-node `other` region, kept with PyTorch;
- views, aliases and identities belong to no region.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.fx as fx

from .attention_chain import claim_attention
from .functional import drop_dead_values, functionalize_inplace, operators_as_functions
from .ops import OpKind, example_tensor, op_info, reduced_dims
from .regions import (
    Region,
    ancestors_of,
    contiguous,
    dtype_of,
    picks,
    same_shape,
    seal,
    shape_of,
)
from .tile_norms import TILE_NORMS, normalized_shape, tile_norm

FAMILY_OF_KIND = {
    OpKind.POINTWISE: "pointwise",
    OpKind.REDUCTION: "reduction",
    OpKind.MATMUL: "matmul",
    OpKind.CONV: "conv",
    OpKind.ATTENTION: "attention",
    OpKind.OTHER: "other",
}
_TAKES_EPILOGUE = {"pointwise", "reduction", "matmul", "conv", "attention"}
# Reductions a matmul's tiles can each take over their columns, and that a second pass then
# combines from the tiles' partial results by the same rule (logsumexp of logsumexps).
_TILE_REDUCTIONS = frozenset({"sum", "mean", "amax", "amin", "logsumexp"})
# Norms of a matmul operand's rows that the matmul applies to the operand's tiles as it loads
# them, from each row's statistics.
ROW_NORMS = ("layer_norm", "rms_norm")
_ORDER_PRESERVING = frozenset(
    """view reshape flatten unflatten unsqueeze squeeze identity detach dropout alpha_dropout
    feature_alpha_dropout dropout1d dropout2d dropout3d""".split()
)


class _Grower:
    """Grows regions in graph order.

    A mutation left in the graph is a barrier: no region spans it, so running each region
    in one piece keeps every read on its side of every write.
    """

    def __init__(self, graph: fx.Graph, claims: Sequence[set[fx.Node]] = ()) -> None:
        self.graph = graph
        self.ancestors = ancestors_of(graph)
        self.claim_of = {node: i for i, nodes in enumerate(claims) for node in nodes}
        self.claimed: dict[int, Region] = {}
        self.region_of: dict[fx.Node, Region] = {}
        self.regions: list[Region] = []
        self.epoch = 0
        self.epoch_of: dict[Region, int] = {}

    def _new(self, family: str, node: fx.Node) -> Region:
        region = Region(family=family, nodes=[node])
        self.regions.append(region)
        self.region_of[node] = region
        self.epoch_of[region] = self.epoch
        return region

    def _open(self, region: Region | None) -> Region | None:
        """`region` if nodes may still join it (no mutation since it began), else None."""
        return region if region is not None and self.epoch_of[region] == self.epoch else None

    def _depends_on(self, node: fx.Node, region: Region) -> bool:
        return any(self.region_of.get(a) is region for a in self.ancestors[node])

    def _convex_with(self, node: fx.Node, region: Region) -> bool:
        """True when no other input of `node` reaches `region` through outside nodes."""
        for parent in node.all_input_nodes:
            if self.region_of.get(parent) is region:
                continue
            if self._depends_on(parent, region):
                return False
        return True

    def _reduced_shape(self, node: fx.Node, region: Region) -> bool:
        """Whether `node` has the shape of a reduction's input in `region`: an epilogue that
        broadcasts the reduction back over what it reduced (`x / x.norm(dim=1, keepdim=True)`)
        is computed in the same pass."""
        return region.family == "reduction" and any(
            same_shape(node, p) for m in region.nodes
            if op_info(m).kind is OpKind.REDUCTION for p in m.all_input_nodes)

    def add_pointwise(self, node: fx.Node) -> None:
        for parent in node.all_input_nodes:
            region = self._open(self.region_of.get(parent))
            if region is None or region.family not in _TAKES_EPILOGUE:
                continue
            if region.family != "pointwise" and not same_shape(node, parent) and \
                    not self._reduced_shape(node, region):
                continue
            if region.family == "matmul" and self._broadcasts_back(node, region):
                continue
            if self._convex_with(node, region):
                region.nodes.append(node)
                self.region_of[node] = region
                self._absorb_chains(node, region)
                return
        self._absorb_chains(node, self._new("pointwise", node))

    def _absorb_chains(self, node: fx.Node, region: Region) -> None:
        """Merge the other pointwise chains `node` joins (`0.5 * x * (1 + tanh(...x...))`)."""
        for parent in node.all_input_nodes:
            other = self._open(self.region_of.get(parent))
            if other is None or other is region or other.family != "pointwise":
                continue
            union = {*region.nodes, *other.nodes}
            entries = {p for m in union for p in m.all_input_nodes if p not in union}
            # Convex when nothing that flows in was itself computed from the union.
            if any(self.ancestors[p] & union for p in entries):
                continue
            for m in other.nodes:
                self.region_of[m] = region
            region.nodes.extend(other.nodes)
            self.regions.remove(other)

    def _broadcasts_back(self, node: fx.Node, region: Region) -> bool:
        """Whether `node` spreads a matmul region's reduced values back over the tile (`x -
        x.logsumexp(-1, keepdim=True)`): the tiles are written before the rows are reduced."""
        reduction = self._reduction_of(region)
        if reduction is None or reduction not in self.ancestors[node]:
            return False
        shape, reduced = shape_of(node), shape_of(reduction)
        return shape is None or reduced is None or math.prod(shape) > math.prod(reduced)

    def _reduction_of(self, region: Region) -> fx.Node | None:
        """The reduction of a matmul region's output rows (not a norm of its operand)."""
        anchor = _anchor_of(region)
        return next((m for m in region.nodes if op_info(m).kind is OpKind.REDUCTION
                     and op_info(m).name not in TILE_NORMS and anchor in self.ancestors[m]),
                    None)

    def _finishes_tiles(self, node: fx.Node) -> Region | None:
        """The open matmul region whose output tiles can finish the normalization `node`
        (`core.runtime.tile_norms`): it normalizes a value of the tile's shape, and reads
        nothing else the region computes (its weight and bias come from outside)."""
        source = node.args[0] if node.args else node.kwargs.get("input")
        region = self._open(self.region_of.get(source)) if isinstance(source, fx.Node) else None
        if region is None or region.family != "matmul":
            return None
        shape, anchor = shape_of(source), shape_of(_anchor_of(region))
        if shape is None or not anchor or math.prod(shape) != math.prod(anchor) or \
                shape[-1] != anchor[-1]:
            return None
        if tile_norm(op_info(node).name, shape, node.args, node.kwargs,
                     dtype_of(source) or torch.float32) is None:
            return None
        inside = any(self.region_of.get(p) is region for p in node.all_input_nodes
                     if p is not source)
        return None if inside or not self._convex_with(node, region) else region

    def _joins_matmul(self, node: fx.Node) -> Region | None:
        """The open matmul region whose tiles `node` can reduce: a reduction of one of the
        region's values over the last dimension only, where that dimension is the matmul
        output's columns (the rows stay the tile's rows); or, once the region has its reduction,
        a reduction over dimensions of size one of a value reduced already (an identity)."""
        if op_info(node).name in TILE_NORMS:
            return self._finishes_tiles(node)
        parents = node.all_input_nodes
        if len(parents) != 1 or "dtype" in node.kwargs:
            return None
        region = self._open(self.region_of.get(parents[0]))
        if region is None or region.family != "matmul":
            return None
        dims, shape = reduced_dims(node), shape_of(parents[0])
        anchor = shape_of(_anchor_of(region))
        if dims is None or shape is None or anchor is None or not anchor:
            return None
        reduction = self._reduction_of(region)
        if reduction is not None:
            reduced = parents[0] is reduction or reduction in self.ancestors[parents[0]]
            known = op_info(node).name in _TILE_REDUCTIONS | {"max", "min"}
            return region if known and reduced and all(shape[d] == 1 for d in dims) else None
        if op_info(node).name not in _TILE_REDUCTIONS or dims != (len(shape) - 1,):
            return None
        same_tile = math.prod(shape) == math.prod(anchor) and shape[-1] == anchor[-1]
        return region if same_tile else None

    def _joins_reduced(self, node: fx.Node) -> Region | None:
        """The open conv or reduction region whose values the reduction `node` reads, if it
        joins it: a conv region without a reduction always (its kernels after the vendor
        convolution read its output once: `generators.compiler.library`); one with a reduction,
        or a reduction region, when `node` reads values of the size the region reduces (a group
        norm's output, else written whole for `node`): the kernels keep the first reduction's
        statistics and read its input again (`generators.compiler.program`)."""
        regions = {self._open(self.region_of.get(p)) for p in node.all_input_nodes}
        found = [r for r in regions if r is not None and r.family in ("conv", "reduction")]
        if len(found) != 1 or not self._convex_with(node, found[0]):
            return None
        region = found[0]
        read = [p for p in node.all_input_nodes if self.region_of.get(p) is region]
        if region.family == "reduction":
            return region if all(self._reduced_shape(p, region) for p in read) else None
        return region if all(same_shape(p, region.nodes[0]) for p in read) or not any(
            op_info(m).kind is OpKind.REDUCTION for m in region.nodes) else None

    def add_reduction(self, node: fx.Node) -> None:
        fused = self._joins_matmul(node) or self._joins_reduced(node)
        if fused is not None:
            fused.nodes.append(node)
            self.region_of[node] = fused
            return
        region = self._new("reduction", node)
        for parent in node.all_input_nodes:
            prologue = self._open(self.region_of.get(parent))
            if prologue is not None and prologue.family == "conv":
                self._take_conv_epilogue(prologue, parent, node, region)
                continue
            if prologue is None or prologue.family != "pointwise" or prologue is region:
                continue
            members = set(prologue.nodes)
            # The row kernel applies the prologue per element of the reduced input; a value the
            # prologue makes that others also read (a residual stream) becomes a second output.
            whole = all(same_shape(m, parent) for m in prologue.nodes)
            others = [p for p in node.all_input_nodes if p not in members]
            if whole and not any(self._depends_on(p, prologue) for p in others):
                for m in prologue.nodes:
                    self.region_of[m] = region
                region.nodes[:0] = prologue.nodes
                self.regions.remove(prologue)

    def _take_conv_epilogue(self, conv: Region, parent: fx.Node, node: fx.Node,
                            region: Region) -> None:
        """Move a conv region's elementwise epilogue into the reduction `node` reads it through,
        as its prologue. A conv site runs the vendor convolution, then its epilogue as one pass
        over the output; in the reduction's kernel the epilogue costs no pass of its own (one
        write and one read of the conv's output fewer). Only an epilogue of the conv output's
        shape that nothing else reads moves."""
        epilogue = conv.nodes[1:]  # the conv anchors its region
        if any(op_info(m).kind is OpKind.REDUCTION for m in epilogue):
            return  # the conv took a reduction of its own (`_joins_reduced`): it keeps its values
        members = set(epilogue)
        if parent not in members or any(u not in members and u is not node
                                         for m in epilogue for u in m.users):
            return
        if not all(same_shape(m, conv.nodes[0]) for m in epilogue):
            return
        for m in epilogue:
            self.region_of[m] = region
        del conv.nodes[1:]
        region.nodes[:0] = epilogue

    def add_matmul(self, node: fx.Node, name: str) -> None:
        """A matmul region, taking the elementwise chain that computes its left operand and
        nothing else (the prologue, applied to each tile of the operand as it is loaded), or a
        layer or RMS norm of that operand's rows with the elementwise ops after it (each row's
        statistics come first, the tiles are normalized as they are loaded): the chain has the
        operand's shape, one of its inputs is a tensor of that shape and dtype (the one the
        kernel walks), and only the matmul reads what it makes."""
        region = self._new("matmul", node)
        position = 1 if name in ("addmm", "baddbmm") else 0
        operand = node.args[position] if len(node.args) > position else None
        if not isinstance(operand, fx.Node):
            return
        prologue = self._open(self.region_of.get(operand))
        if prologue is None or list(operand.users) != [node] or not (
                prologue.family == "pointwise" or _row_norm_first(prologue)):
            return
        members = set(prologue.nodes)
        if any(u not in members for m in prologue.nodes if m is not operand for u in m.users):
            return
        entries = {p for m in prologue.nodes for p in m.all_input_nodes if p not in members}
        carried = dtype_of(operand) is not None and any(
            same_shape(p, operand) and dtype_of(p) == dtype_of(operand) for p in entries)
        others = [p for p in node.all_input_nodes if p is not operand]
        if not carried or not all(same_shape(m, operand) for m in prologue.nodes) or \
                any(self._depends_on(p, prologue) for p in others):
            return
        for m in prologue.nodes:
            self.region_of[m] = region
        region.nodes[:0] = prologue.nodes
        self.regions.remove(prologue)

    def grow(self) -> list[Region]:
        for node in self.graph.nodes:
            if node.op not in ("call_function", "call_method"):
                continue
            if node in self.claim_of:
                self.add_claimed(node)
                continue
            info = op_info(node)
            kind = info.kind
            if info.inplace:
                self.epoch += 1  # a mutation something may observe: kept, as written
                continue
            if kind is OpKind.POINTWISE:
                self.add_pointwise(node)
            elif kind is OpKind.REDUCTION:
                self.add_reduction(node)
            elif kind is OpKind.OTHER:
                if any(example_tensor(p) is not None for p in node.all_input_nodes):
                    self._new("other", node)
            elif kind is OpKind.VIEW:
                self.add_reshape(node, info.name)
            elif kind is OpKind.MATMUL:
                self.add_matmul(node, info.name)
            else:
                self._new(FAMILY_OF_KIND[kind], node)
        for region in self.regions:
            self._trim_reshapes(region)
        return self.regions

    def add_claimed(self, node: fx.Node) -> None:
        """A node of attention written out: its region is made whole as its nodes come."""
        claim = self.claim_of[node]
        if claim not in self.claimed:
            self.claimed[claim] = self._new("attention", node)
        else:
            self.claimed[claim].nodes.append(node)
            self.region_of[node] = self.claimed[claim]

    def add_reshape(self, node: fx.Node, name: str) -> None:
        """Carry a region through an order-preserving reshape, so its epilogue can follow
        (`addmm(...).view(b, t, c) + residual`); trimmed at the end if nothing in it reads it."""
        parents = node.all_input_nodes
        picked = picks(node)
        if (name not in _ORDER_PRESERVING and not picked) or len(parents) != 1:
            return
        region = self._open(self.region_of.get(parents[0]))
        if region is None or region.family not in _TAKES_EPILOGUE:
            return
        if picked or (contiguous(parents[0]) and contiguous(node)):
            region.nodes.append(node)
            self.region_of[node] = region

    def _trim_reshapes(self, region: Region) -> None:
        while True:
            members = set(region.nodes)
            # A pick of a tuple-valued op stays: the region's output must be a tensor.
            dangling = [n for n in region.nodes if op_info(n).kind is OpKind.VIEW
                        and not picks(n) and not any(u in members for u in n.users)]
            if not dangling:
                return
            for node in dangling:
                region.nodes.remove(node)
                del self.region_of[node]


def _anchor_of(region: Region) -> fx.Node:
    """A matmul region's matmul (after its prologue, if it has one)."""
    return next(m for m in region.nodes if op_info(m).kind is OpKind.MATMUL)


def _row_norm_first(region: Region) -> bool:
    """Whether `region` is a layer or RMS norm over the last dimension of a value from outside,
    then elementwise ops: a matmul can normalize its operand's tiles from each row's
    statistics."""
    norm, rest = region.nodes[0], region.nodes[1:]
    shape = normalized_shape(norm.args, norm.kwargs)
    return (region.family == "reduction" and op_info(norm).name in ROW_NORMS
            and shape is not None and len(shape) == 1
            and all(op_info(m).kind is OpKind.POINTWISE for m in rest))


def partition(graph: fx.Graph) -> list[Region]:
    """Spell operators one way, drop dead values, functionalize safe in-place ops, claim
    attention written out, then cut `graph` into regions (in graph order)."""
    operators_as_functions(graph)
    drop_dead_values(graph)
    functionalize_inplace(graph)
    claims = claim_attention(graph, ancestors_of(graph))
    regions = _Grower(graph, claims).grow()
    order = {node: i for i, node in enumerate(graph.nodes)}
    for region in regions:
        seal(region, order)
    regions.sort(key=lambda r: order[r.nodes[0]])
    return regions
