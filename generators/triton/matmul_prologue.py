"""A matmul site's prologue, for the Triton matmul kernel: the elementwise ops that compute the
left operand, applied to each [BLOCK_M, BLOCK_K] tile as it is loaded.

The operand is never written: the kernel walks the prologue's carrier (its input of the
operand's shape and dtype) where it would walk the operand, loads the prologue's other inputs at
the same coordinates, and computes the chain in fp32 before the product. Columns past K are set
to zero after the chain, which may not map zero to zero.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from generators.site_graph import Op, Ref, SiteGraph, Unsupported
from generators.triton.expressions import elementwise

# The left operand's position in each anchor's arguments.
LEFT = {"linear": 0, "mm": 0, "bmm": 0, "matmul": 0, "addmm": 1, "baddbmm": 1}


@dataclass
class Prologue:
    """What the kernel loads and computes, per tile of the left operand, before its product."""

    carrier: Ref
    operands: dict[int, str] = field(default_factory=dict)  # input index → operand name
    body: list[str] = field(default_factory=list)
    result: str = ""

    def forward_lines(self) -> list[str]:
        """The other inputs, broadcast to the carrier and laid out as `a` is."""
        return [f"{name} = in{index}.expand({self.carrier.name}.shape).reshape(a.shape)"
                for index, name in self.operands.items()]

    def params(self) -> list[str]:
        return [f"{n}_ptr, {n}_sb, {n}_sm, {n}_sk," for n in self.operands.values()]

    def args(self) -> list[str]:
        return [f"{n}, *{n}.stride()," for n in self.operands.values()]

    def tiles(self) -> list[str]:
        return [f"{n}_tile = {n}_ptr + batch * {n}_sb + (rows % M)[:, None] * {n}_sm + "
                f"ks[None, :] * {n}_sk" for n in self.operands.values()]

    def loop_lines(self) -> list[str]:
        """In the K loop, after `a` is loaded: the chain, then `a` replaced by its result."""
        loads = [f"{n} = tl.load({n}_tile, mask=ks[None, :] < K - k0, other=0.0)"
                 ".to(tl.float32)" for n in self.operands.values()]
        steps = [f"{n}_tile += BLOCK_K * {n}_sk" for n in self.operands.values()]
        return ["a_in = a.to(tl.float32)", *loads, *self.body,
                f"a = tl.where(ks[None, :] < K - k0, {self.result}, 0.0)",
                # Rounded to the operand's dtype as PyTorch rounds it, except in the Triton
                # interpreter (WIDEN), which rounds fp32 to bf16 by truncation.
                "if not WIDEN:",
                "    a = a.to(a_ptr.dtype.element_ty)", *steps]


def split(graph: SiteGraph) -> tuple[int, Op, Prologue | None]:
    """The anchor's index, the anchor with the carrier in place of a computed left operand, and
    the prologue (None when the site's ops start with the matmul)."""
    top = next((i for i, op in enumerate(graph.ops) if op.kind.value == "matmul"), None)
    if top is None:
        raise Unsupported("the site has no matmul")
    anchor = graph.ops[top]
    if top == 0:
        return 0, anchor, None
    position = LEFT.get(anchor.name)
    operand = anchor.args[position] if position is not None and \
        len(anchor.args) > position else None
    if not isinstance(operand, Ref) or operand.is_input:
        raise Unsupported(f"ops before {anchor.name} that do not compute its left operand")
    shape, dtype = tuple(graph.info(operand).shape), graph.info(operand).dtype

    def reads(op: Op) -> list[Ref]:
        return [r for r in op.args + tuple(v for _, v in op.kwargs)
                if isinstance(r, Ref) and r.is_input]

    carrier = next((r for op in graph.ops[:top] for r in reads(op)
                    if tuple(graph.inputs[r.index].shape) == shape
                    and graph.inputs[r.index].dtype == dtype), None)
    if carrier is None:
        raise Unsupported("no input of the prologue has the operand's shape and dtype")
    prologue = Prologue(carrier)
    value: dict[Ref, str] = {carrier: "a_in"}
    for i, op in enumerate(graph.ops[:top]):
        if op.kind.value != "pointwise" or tuple(op.out.shape) != shape:
            raise Unsupported(f"{op.name} before the matmul is not elementwise on its operand")
        for ref in reads(op):
            if ref in value:
                continue
            if not graph.inputs[ref.index].dtype.is_floating_point:
                raise Unsupported(f"input {ref.name} of the prologue is "
                                  f"{graph.inputs[ref.index].dtype}")
            prologue.operands[ref.index] = value[ref] = f"p{len(prologue.operands)}"
        prologue.body.append(f"u{i} = {elementwise(op, value)}")
        value[Ref(i, False)] = f"u{i}"
    if operand not in value:
        raise Unsupported(f"the prologue does not compute {anchor.name}'s left operand")
    prologue.result = value[operand]
    args = list(anchor.args)
    args[position] = prologue.carrier
    return top, replace(anchor, args=tuple(args)), prologue
