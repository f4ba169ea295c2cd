"""What a flash-attention kernel computes for an `attention` site, read off its graph.

A site is either scaled_dot_product_attention or attention written out (`core.runtime.
attention_chain`): Q·Kᵀ, elementwise ops on the scores (a scale, a mask filled with -inf, an
additive bias), a softmax over the keys (or none: the elementwise ops give the weights),
identities and casts, then ·V, and an elementwise epilogue. The plan holds the Triton lines that
turn a tile of fp32 scores `s` into the logits (masks and biases are operands read through their
broadcast strides; constants the site builds itself from factories are evaluated here and
written as expressions of the tile's rows and columns), and the causal offset past which every
logit is a fill the softmax gives no weight: key tiles there are skipped. Only `is_causal` or a
mask built inside the site gives one, never a mask the site reads as an input, whose values are
not known when the kernel is written.
"""

from __future__ import annotations

import math
import operator
from dataclasses import dataclass, field

import torch

from generators.codegen import arg, arg_at, op_refs, ops_needed
from generators.op_table import CASTS, IDENTITIES
from generators.site_graph import Op, Ref, SiteGraph, Unsupported
from generators.triton.expressions import TRITON, elementwise

FLOATS = (torch.float32, torch.float16, torch.bfloat16)
# Between the softmax and ·V: identities in inference and casts (P is rounded to V's dtype).
PASSES = IDENTITIES | CASTS | {"contiguous", "type"}
NEG_INF = 'float("-inf")'
# The shapes an operand is broadcast to, named as the kernel's forward names them.
SCORES, OUTPUT = "scores", "output"


@dataclass
class Plan:
    """What the kernel computes, read off the site's graph."""

    q: Ref
    k: Ref
    v: Ref
    k_transposed: bool  # the site reads Kᵀ ([..., D, S]) rather than K
    dtype: torch.dtype  # of Q, K and V
    score_lines: list[str] = field(default_factory=list)  # from `s` (fp32) to the logits
    logits: str = "s"
    epilogue_lines: list[str] = field(default_factory=list)  # from `o` on
    outputs: list[tuple[str, torch.dtype]] = field(default_factory=list)
    # Each input the kernel reads besides Q, K and V, and the shape it broadcasts to there.
    operands: list[tuple[Ref, str]] = field(default_factory=list)
    causal_offset: int | None = None  # keys past query + offset are all masked: skipped
    # Each constant band's expression and its value on or below its diagonal, and the lowest
    # diagonal: key tiles below it read every band as that value.
    bands: list[tuple[str, str]] = field(default_factory=list)
    inner_offset: int | None = None
    empty: str = "float('nan')"  # the output of a row whose every score is masked
    scale: str = ""  # forward's expression of the sdpa scale; empty for written-out attention
    normalized: bool = True  # a softmax of the logits weighs V; else the logits themselves do

    def operand(self, ref: Ref, over: str) -> str:
        if (ref, over) not in self.operands:
            self.operands.append((ref, over))
        return f"x{self.operands.index((ref, over))}"


def _input(graph: SiteGraph, value: object, what: str) -> Ref:
    if not isinstance(value, Ref) or not value.is_input:
        raise Unsupported(f"{what} is computed inside the site; the kernel reads it as an input")
    if graph.info(value).dtype not in FLOATS:
        raise Unsupported(f"{what} is {graph.info(value).dtype}, not a float tensor")
    return value


def _sdpa_plan(graph: SiteGraph) -> Plan:
    op = graph.ops[0]
    if arg(op, "dropout_p", 4, 0.0) or arg(op, "enable_gqa", 7, False):
        raise Unsupported("scaled_dot_product_attention with dropout or grouped query heads")
    q, k, v = (_input(graph, arg(op, name, i), name)
               for i, name in enumerate(("query", "key", "value")))
    plan = Plan(q, k, v, False, graph.info(q).dtype, empty="0.0")
    scale = arg(op, "scale", 6)
    if isinstance(scale, Ref):
        raise Unsupported("a tensor scale")
    plan.scale = repr(float(scale)) if scale is not None else "1.0 / math.sqrt(q.shape[-1])"
    plan.score_lines.append("t = s * SCALE")
    mask = arg(op, "attn_mask", 3)
    if isinstance(mask, Ref):
        if not mask.is_input:
            raise Unsupported("a mask computed inside the site")
        loaded = plan.operand(mask, SCORES)
        plan.score_lines.append(f"t = tl.where({loaded} != 0, t, {NEG_INF})"
                                if graph.info(mask).dtype == torch.bool else f"t = t + {loaded}")
    elif mask is not None:
        raise Unsupported(f"attn_mask {mask!r}")
    if arg(op, "is_causal", 5, False):
        plan.score_lines.append(f"t = tl.where({_band(plan, '1.0', '0.0', 0)} != 0, t, {NEG_INF})")
        plan.causal_offset = 0
    plan.logits = "t"
    _epilogue(graph, plan, {0}, 0, constant_values(graph))
    return plan


def _written_plan(graph: SiteGraph) -> Plan:
    """Attention written out: first matmul, score ops, softmax, passes, second matmul; or with
    no softmax, elementwise weights of the scores (`relu`, `sigmoid`) straight into ·V."""
    names = [op.name for op in graph.ops]
    matmuls = [i for i, name in enumerate(names) if name in ("matmul", "bmm")]
    if len(matmuls) != 2 or names.count("softmax") > 1:
        raise Unsupported("not two matmuls with at most one softmax between them")
    soft = names.index("softmax") if "softmax" in names else None
    if soft is not None and not matmuls[0] < soft < matmuls[1]:
        raise Unsupported("not one softmax between two matmuls")
    first, second = (graph.ops[i] for i in matmuls)
    q, kt = (_input(graph, a, what) for a, what in zip(first.args, ("Q", "Kᵀ"), strict=True))
    v = _input(graph, second.args[1], "V")
    dtypes = {graph.info(r).dtype for r in (q, kt, v)}
    if len(dtypes) != 1:
        raise Unsupported(f"Q, K and V of different dtypes: {sorted(map(str, dtypes))}")
    plan = Plan(q, kt, v, True, dtypes.pop())
    scores = graph.ops[matmuls[0]].out
    constants = constant_values(graph)
    value: dict[Ref, str] = {Ref(matmuls[0], False): "s"}
    derived = {Ref(matmuls[0], False)}  # values computed from the scores
    logits = graph.ops[soft].args[0] if soft is not None else second.args[0]
    feeding = ops_needed(graph, [logits], set()) - set(constants) - {matmuls[0]}
    for i in sorted(feeding):  # ops on masks and biases alone may come before the scores
        op, here = graph.ops[i], Ref(i, False)
        refs = op_refs(op)
        for ref in refs:
            if ref.is_input:
                value[ref] = plan.operand(ref, SCORES)
            elif ref.index in constants and ref not in value:
                value[ref] = _constant(constants[ref.index], scores.shape, plan)
        if any(r in derived for r in refs):
            derived.add(here)
            if tuple(op.out.shape) != tuple(scores.shape):
                raise Unsupported(f"{op.name} changes the scores' shape")
        plan.score_lines.append(f"t{i} = {_elementwise(op, value)}")
        value[here] = f"t{i}"
    if logits not in derived:
        raise Unsupported(f"the {'softmax' if soft is not None else 'second matmul'} does not "
                          "read the scores")
    plan.logits = value[logits]
    if soft is None:
        plan.normalized = False
        _epilogue(graph, plan, {*matmuls, *feeding}, matmuls[1], constants)
        return plan
    chain = Ref(soft, False)
    for i in range(soft + 1, matmuls[1]):
        op = graph.ops[i]
        if op.name not in PASSES or not op.args or op.args[0] != chain:
            raise Unsupported(f"{op.name} between the softmax and the second matmul")
        chain = Ref(i, False)
    if second.args[0] != chain:
        raise Unsupported("the second matmul does not read the probabilities")
    plan.causal_offset = _causal_offset(graph, soft, derived, constants, scores.shape)
    core = {*matmuls, *feeding, *range(soft, matmuls[1])}
    _epilogue(graph, plan, core, matmuls[1], constants)
    return plan


def _elementwise(op: Op, value: dict[Ref, str]) -> str:
    if op.name in ("contiguous", "type"):  # an identity, or a cast that `to` writes alike
        dtype = op.out.dtype
        return TRITON.round_to(dtype, value[op.args[0]]) if op.name == "type" else \
            value[op.args[0]]
    return elementwise(op, value)


def _constant(value: torch.Tensor, shape: torch.Size, plan: Plan) -> str:
    """A constant of the site as an expression of the tile's rows and columns."""
    found = band(value, shape)
    if found is None:
        raise Unsupported("a mask or bias built inside the site that is neither one value nor "
                          "a band along the diagonal (a causal mask)")
    low, high, offset = found
    if low == high:
        return TRITON.const(low)
    return _band(plan, TRITON.const(low), TRITON.const(high), offset)


def _band(plan: Plan, low: str, high: str, offset: int) -> str:
    expression = f"tl.where(cols[None, :] - rows[:, None] <= {offset}, {low}, {high})"
    plan.bands.append((expression, low))
    plan.inner_offset = offset if plan.inner_offset is None else min(plan.inner_offset, offset)
    return expression


def _causal_offset(graph: SiteGraph, soft: int, derived: set[Ref],
                   constants: dict[int, torch.Tensor], shape: torch.Size) -> int | None:
    """The offset past which the logits are a fill no softmax weighs (-inf, or a finite minimum
    with every row keeping a key), when the last op before the softmax sets them so from a
    constant band; None when nothing may be skipped."""
    ref = graph.ops[soft].args[0]
    while not ref.is_input and graph.ops[ref.index].name in PASSES:
        ref = graph.ops[ref.index].args[0]
    if ref.is_input or ref not in derived:
        return None
    op = graph.ops[ref.index]
    found = evaluated_fill(op, derived, constants, shape)
    if found is None:
        return None
    fill, offset = found
    dtype = op.out.dtype
    negligible = fill <= max(torch.finfo(dtype).min, -1e9) and offset >= 0
    return offset if fill == -math.inf or negligible else None


def _epilogue(graph: SiteGraph, plan: Plan, core: set[int], anchor: int,
              constants: dict[int, torch.Tensor]) -> None:
    """Every op outside the attention's `core` (and its constants), elementwise on its output
    `o` (op `anchor`) or on inputs that broadcast to it; then the outputs."""
    value = {Ref(anchor, False): "o"}
    out_shape = tuple(graph.ops[anchor].out.shape)
    for i, op in enumerate(graph.ops):
        if i in core or i in constants:
            continue
        if op.kind.value != "pointwise" and op.name not in IDENTITIES:
            raise Unsupported(f"{op.name} after the attention is not elementwise on its output")
        refs = op_refs(op)
        for ref in refs:
            if ref.is_input:
                value[ref] = plan.operand(ref, OUTPUT)
            elif ref.index in constants and ref not in value:
                if constants[ref.index].numel() != 1:
                    raise Unsupported("a tensor constant in the epilogue")
                value[ref] = TRITON.const(float(constants[ref.index].reshape(-1)[0]))
            elif ref not in value:
                raise Unsupported(f"{op.name} after the attention reads the scores")
        if len(op.out.shape) > len(out_shape) or any(
                a not in (1, b) for a, b in zip(op.out.shape[::-1], out_shape[::-1],
                                               strict=False)):
            raise Unsupported(f"{op.name} after the attention broadcasts its output")
        plan.epilogue_lines.append(f"o{i} = {_elementwise(op, value)}")
        value[Ref(i, False)] = f"o{i}"
    for ref in graph.outputs:
        if ref not in value or ref.is_input:
            raise Unsupported("an output that is not the attention's or its epilogue's")
        plan.outputs.append((value[ref], graph.info(ref).dtype))


def read_plan(graph: SiteGraph) -> Plan:
    if graph.family != "attention" or not graph.ops:
        raise Unsupported("not an attention site")
    if graph.ops[0].name == "scaled_dot_product_attention":
        return _sdpa_plan(graph)
    return _written_plan(graph)


_FACTORIES = {"new_ones": torch.ones, "new_zeros": torch.zeros, "new_full": torch.full}


def constant_values(graph: SiteGraph) -> dict[int, torch.Tensor]:
    """The value, on the CPU, of every op computed from factories alone (the receiver of
    `new_ones` lends only its device and dtype)."""
    values: dict[int, torch.Tensor] = {}
    for i, op in enumerate(graph.ops):
        refs = op_refs(op)
        try:
            if op.name in _FACTORIES and refs == [op.args[0]]:
                dtype = op.kwarg("dtype") or graph.info(op.args[0]).dtype
                values[i] = _FACTORIES[op.name](*op.args[1:], dtype=dtype)
            elif refs and all(not r.is_input and r.index in values for r in refs):
                values[i] = _call(op, values)
        except (RuntimeError, TypeError, ValueError, IndexError) as error:
            raise Unsupported(f"{op.name}, a constant of the site, does not evaluate: {error}"
                              ) from error
    return values


def _call(op: Op, values: dict[int, torch.Tensor]) -> torch.Tensor:
    def resolve(x: object) -> object:
        if isinstance(x, Ref):
            return values[x.index]
        if isinstance(x, tuple):
            return tuple(resolve(v) for v in x)
        return torch.device("cpu") if isinstance(x, torch.device) else x

    args = [resolve(a) for a in op.args]
    kwargs = {k: resolve(v) for k, v in op.kwargs}
    if op.name == "getitem":
        return operator.getitem(*args)
    # The method where one exists (`m.view(1, 1, t, t)`); `where` is the function's argument order.
    if isinstance(args[0], torch.Tensor) and op.name != "where" and \
            hasattr(torch.Tensor, op.name):
        return getattr(torch.Tensor, op.name)(*args, **kwargs)
    return getattr(torch, op.name)(*args, **kwargs)


def band(value: torch.Tensor, shape: torch.Size) -> tuple[float, float, int] | None:
    """`value`, broadcast to the scores' `shape`, as where(column - row <= offset, low, high):
    (low, high, offset); None when it differs across batch or heads or is no such band."""
    if value.dim() > 2 and any(size != 1 for size in value.shape[:-2]):
        return None
    rows, cols = shape[-2], shape[-1]
    plane = value.reshape(value.shape[-2:] if value.dim() >= 2 else (1, -1)).float()
    plane = plane.expand(rows, cols)
    diagonal = torch.arange(cols)[None, :] - torch.arange(rows)[:, None]
    low, high = plane[-1, 0].item(), plane[0, -1].item()
    offset = int(diagonal[_same(plane, low)].max())
    if not _same(plane, torch.where(diagonal <= offset, low, high)).all():
        return None
    return low, high, offset


def _same(a: torch.Tensor, b: torch.Tensor | float) -> torch.Tensor:
    b = torch.as_tensor(b, dtype=a.dtype)
    return (a == b) | (a.isnan() & b.isnan())


def evaluated_fill(op: Op, derived: set[Ref], constants: dict[int, torch.Tensor],
                   shape: torch.Size) -> tuple[float, int] | None:
    """(fill, offset) when `op` sets every logit with column - row > offset to the constant
    `fill` whatever the scores, from a causal band that keeps every logit on its other side:
    `masked_fill(x, ~tril, fill)`, `where(tril, x, fill)`, `x + triu(-inf, 1)`."""
    def band_of(x: object) -> tuple[float, float, int] | None:
        if isinstance(x, Ref) and not x.is_input and x.index in constants:
            return band(constants[x.index], shape)
        return None

    def scalar(x: object) -> float | None:
        if isinstance(x, int | float) and not isinstance(x, bool):
            return float(x)
        found = band_of(x)
        return found[0] if found is not None and found[0] == found[1] else None

    def causal(x: object, hidden_high: bool) -> int | None:
        found = band_of(x)
        if found is None or found[0] == found[1]:
            return None
        low, high, offset = found
        return offset if bool(high) == hidden_high and bool(low) != hidden_high else None

    first, second, third = (arg_at(op, i) for i in range(3))
    if op.name == "masked_fill" and first in derived:
        offset, fill = causal(second, True), scalar(third)
    elif op.name == "where" and second in derived:
        offset, fill = causal(first, False), scalar(third)
    elif op.name == "where" and third in derived:
        offset, fill = causal(first, True), scalar(second)
    elif op.name == "add" and arg(op, "alpha", 2, 1) == 1 and (first in derived) != (
            second in derived):
        found = band_of(second if first in derived else first)
        ok = found is not None and found[1] == -math.inf and math.isfinite(found[0])
        offset, fill = (found[2], -math.inf) if ok else (None, None)
    else:
        return None
    return None if offset is None or fill is None else (fill, offset)
