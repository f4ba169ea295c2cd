"""A matmul site's prologue, for the Triton matmul kernel: the elementwise ops that compute the
left operand, applied to each [BLOCK_M, BLOCK_K] tile as it is loaded.

The operand is never written: the kernel walks the prologue's carrier (its input of the
operand's shape and dtype) where it would walk the operand, loads the prologue's other inputs at
the same coordinates, and computes the chain in fp32 before the product. Columns past K are set
to zero after the chain, which may not map zero to zero.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from core.runtime.partition import ROW_NORMS
from core.runtime.tile_norms import row_norm_arguments
from generators.codegen import op_refs
from generators.site_graph import Op, Ref, SiteGraph, Unsupported
from generators.triton.expressions import elementwise
from generators.triton.matmul_anchor import is_anchor

# The left operand's position in each anchor's arguments.
LEFT = {"linear": 0, "mm": 0, "bmm": 0, "matmul": 0, "addmm": 1, "baddbmm": 1}


# Each row's statistics for a norm prologue, before the product: one fp32 pass for RMS norm,
# two for layer norm (the mean, then the squares of the values around it).
STATS_KERNEL = '''

@triton.jit
def row_stats_kernel(
    x_ptr, stats_ptr, ROWS, M, x_sb, x_sm, x_sk, EPS,
    K: tl.constexpr, RMS: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_K: tl.constexpr,
):
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    row_ok = rows < ROWS
    base = (rows // M).to(tl.int64) * x_sb + (rows % M) * x_sm
    ks = tl.arange(0, BLOCK_K)
    mean = tl.zeros((BLOCK_R,), tl.float32)
    if not RMS:
        for k0 in range(0, K, BLOCK_K):
            x = tl.load(x_ptr + base[:, None] + (k0 + ks)[None, :] * x_sk,
                        mask=row_ok[:, None] & (k0 + ks < K)[None, :], other=0.0)
            mean += tl.sum(x.to(tl.float32), 1)
        mean = mean / K
    squares = tl.zeros((BLOCK_R,), tl.float32)
    for k0 in range(0, K, BLOCK_K):
        inside = row_ok[:, None] & (k0 + ks < K)[None, :]
        x = tl.load(x_ptr + base[:, None] + (k0 + ks)[None, :] * x_sk, mask=inside, other=0.0)
        centered = tl.where(inside, x.to(tl.float32) - mean[:, None], 0.0)
        squares += tl.sum(centered * centered, 1)
    tl.store(stats_ptr + rows * 2, mean, mask=row_ok)
    tl.store(stats_ptr + rows * 2 + 1, 1.0 / tl.sqrt(squares / K + EPS), mask=row_ok)
'''


@dataclass
class Prologue:
    """What the kernel loads and computes, per tile of the left operand, before its product."""

    carrier: Ref
    operands: dict[int, str] = field(default_factory=dict)  # input index → operand name
    body: list[str] = field(default_factory=list)
    result: str = ""
    norm: str = ""  # "layer_norm" or "rms_norm" of the carrier's rows, first; else none
    eps: float = 0.0

    def forward_lines(self) -> list[str]:
        """The other inputs, broadcast to the carrier and laid out as `a` is; each row's
        statistics where the prologue starts with a norm."""
        lines = [f"{name} = in{index}.expand({self.carrier.name}.shape).reshape(a.shape)"
                 for index, name in self.operands.items()]
        if self.norm:
            lines += ["stats = torch.empty((batch * M, 2), device=a.device, dtype=torch.float32)",
                      "row_stats_kernel[(triton.cdiv(batch * M, 16),)](",
                      f"    a, stats, batch * M, M, *a.stride(), {self.eps!r}, K=K,",
                      f"    RMS={self.norm == 'rms_norm'}, BLOCK_R=16,",
                      "    BLOCK_K=min(128, triton.next_power_of_2(K)),",
                      ")"]
        return lines

    def params(self) -> list[str]:
        return [f"{n}_ptr, {n}_sb, {n}_sm, {n}_sk," for n in self.operands.values()] + (
            ["stats_ptr,"] if self.norm else [])

    def args(self) -> list[str]:
        return [f"{n}, *{n}.stride()," for n in self.operands.values()] + (
            ["stats,"] if self.norm else [])

    def tiles(self) -> list[str]:
        lines = [f"{n}_tile = {n}_ptr + batch * {n}_sb + (rows % M)[:, None] * {n}_sm + "
                 f"ks[None, :] * {n}_sk" for n in self.operands.values()]
        if self.norm:
            lines += ["row_mean = tl.load(stats_ptr + (batch * M + rows % M) * 2)[:, None]",
                      "row_rstd = tl.load(stats_ptr + (batch * M + rows % M) * 2 + 1)[:, None]"]
        return lines

    def kernels(self) -> str:
        return STATS_KERNEL if self.norm else ""

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


def _normalized(op: Op, prologue: Prologue, value: dict[Ref, str],
                shape: tuple[int, ...]) -> str:
    """A layer or RMS norm of the carrier's rows, from their statistics, with its affine."""
    parsed = row_norm_arguments(op.name, op.args, dict(op.kwargs), op.out.dtype)
    if op.args[0] != prologue.carrier or parsed.normalized != shape[-1:]:
        raise Unsupported(f"{op.name} of more than the rows of the matmul's operand")
    prologue.norm, prologue.eps = op.name, parsed.eps
    text = "(a_in - row_mean) * row_rstd" if op.name == "layer_norm" else "a_in * row_rstd"
    if isinstance(parsed.weight, Ref):
        text = f"{text} * {value[parsed.weight]}"
    if isinstance(parsed.bias, Ref):
        text = f"{text} + {value[parsed.bias]}"
    return text


def split(graph: SiteGraph) -> tuple[int, Op, Prologue | None]:
    """The anchor's index, the anchor with the carrier in place of a computed left operand, and
    the prologue (None when the site's ops start with the matmul)."""
    top = next((i for i, op in enumerate(graph.ops) if is_anchor(graph, op)), None)
    if top is None:
        raise Unsupported("the site has no matmul, nor a convolution that is one (a 1×1 kernel, "
                          "stride 1, no padding or dilation, one group)")
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
        return [r for r in op_refs(op) if r.is_input]

    carrier = next((r for op in graph.ops[:top] for r in reads(op)
                    if tuple(graph.inputs[r.index].shape) == shape
                    and graph.inputs[r.index].dtype == dtype), None)
    if carrier is None:
        raise Unsupported("no input of the prologue has the operand's shape and dtype")
    prologue = Prologue(carrier)
    value: dict[Ref, str] = {carrier: "a_in"}
    for i, op in enumerate(graph.ops[:top]):
        norm = i == 0 and op.name in ROW_NORMS
        if not (norm or op.kind.value == "pointwise") or tuple(op.out.shape) != shape:
            raise Unsupported(f"{op.name} before the matmul is not elementwise on its operand")
        for ref in reads(op):
            if ref in value:
                continue
            if not graph.inputs[ref.index].dtype.is_floating_point:
                raise Unsupported(f"input {ref.name} of the prologue is "
                                  f"{graph.inputs[ref.index].dtype}")
            prologue.operands[ref.index] = value[ref] = f"p{len(prologue.operands)}"
        line = _normalized(op, prologue, value, shape) if norm else elementwise(op, value)
        prologue.body.append(f"u{i} = {line}")
        value[Ref(i, False)] = f"u{i}"
    if operand not in value:
        raise Unsupported(f"the prologue does not compute {anchor.name}'s left operand")
    prologue.result = value[operand]
    args = list(anchor.args)
    args[position] = prologue.carrier
    return top, replace(anchor, args=tuple(args)), prologue
