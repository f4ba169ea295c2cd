"""Tier-1 Triton for `attention` sites: one flash-attention kernel, the scores never stored.

Each program owns BLOCK_M queries of one (batch, head) and walks the keys BLOCK_N at a time:
`tl.dot` makes a tile of fp32 scores, the site's own ops turn it into logits in registers
(`attention_plan`), and an online softmax keeps a running maximum and sum per query, rescaling
the fp32 accumulator of P·V whenever the maximum grows; P is rounded to V's dtype for the second
`tl.dot`, as PyTorch's matmul takes it. Where elementwise ops of the scores weigh V with no
softmax (ReLU attention), their tile is P itself and the accumulator only grows. Key tiles past
a causal mask are not visited, and the programs with the most keys start first. A row whose
every logit is -inf has no mass: NaN, as softmax gives, or 0 for scaled_dot_product_attention,
as PyTorch's gives.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from core.runtime.cuda import MAX_DYNAMIC_SHARED
from generators.codegen import BROADCAST_SHAPE_HELPER, indent
from generators.site_graph import SiteGraph, Unsupported
from generators.triton.attention_plan import OUTPUT, SCORES, Plan, read_plan
from generators.triton.expressions import tl_dtype, with_jit_helpers
from generators.triton.precision import DESCRIBED, check_precision, dot_precision


@dataclass(frozen=True)
class AttentionConfig:
    block_m: int = 64  # queries a program
    block_n: int = 64  # keys a step
    num_warps: int = 4
    num_stages: int = 2
    precision: str = "ieee"  # of fp32 operands (generators.triton.precision)

    def __post_init__(self) -> None:
        check_precision(self.precision)

    def describe(self) -> str:
        return (f"{self.block_m} queries × {self.block_n} keys a step, {self.num_warps} warps, "
                f"{self.num_stages} stages{DESCRIBED[self.precision]}")


# The largest head dimension a program holds whole: a [BLOCK_M, D] accumulator and [BLOCK_N, D]
# tiles of K and V, in registers and shared memory (FlashAttention's kernels stop at 256 too).
MAX_HEAD = 256


def shared_bytes(graph: SiteGraph, plan: Plan, config: AttentionConfig) -> int:
    """What a program keeps in shared memory, counted from below: the Q tile and each stage's
    K and V tiles, fp32 operands of three tf32 products twice over (their hi and lo halves).
    An fp32 draft of 128 × 64 tiles at three stages comes to 256 KiB here; Triton asked 288
    (bench/NOTES.md, 2026-12-05, 17:00-17:33 UTC). What else Triton keeps there (the
    probabilities' tile, a mask's) depends on its pipeliner, so it is left out: a config
    refused here fails on the GPU for certain."""
    head_k, head_v = graph.info(plan.q).shape[-1], graph.info(plan.v).shape[-1]
    halves = 2 if plan.dtype == torch.float32 and config.precision == "tf32x3" else 1
    size = plan.dtype.itemsize * halves
    tiles = config.num_stages * config.block_n * (head_k + head_v) * size
    return config.block_m * head_k * size + tiles


_SOURCE = '''"""Kiln rules kernel (triton, attention): {ops}. {config}."""

import math

import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def attention_kernel(
    q_ptr, k_ptr, v_ptr,
{pointer_params}
    q_sb, q_sh, q_sm, q_sd, k_sb, k_sh, k_sn, k_sd, v_sb, v_sh, v_sn, v_sd,
{stride_params}
    H, L, SCALE,
    S: tl.constexpr, D: tl.constexpr, DV: tl.constexpr,
    BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
    WIDEN: tl.constexpr, INTERPRET: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):
    # The last block of queries reads the most keys under a causal mask: it starts first.
    pid_m = tl.num_programs(0) - 1 - tl.program_id(0)
    bh = tl.program_id(1).to(tl.int64)
    b = bh // H
    h = bh % H
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = rows < L
    dq = tl.arange(0, BLOCK_D)
    dv = tl.arange(0, BLOCK_DV)
    q = tl.load(q_ptr + b * q_sb + h * q_sh + rows[:, None] * q_sm + dq[None, :] * q_sd,
                mask=row_ok[:, None] & (dq < D)[None, :], other=0.0)
    if WIDEN:
        q = q.to(tl.float32)
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_DV], tl.float32)
{bound}
    if INTERPRET:
        # The interpreter loops to compile-time bounds only: every tile, those past `hi` not run.
        for start in range(0, S, BLOCK_N):
{interpreted_steps}
    else:
{steps}
{finish}
{epilogue}
{stores}


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, {params}):
        q, k, v = {q}, {k}, {v}
        L, D, S, DV = q.shape[-2], q.shape[-1], k.shape[-2], v.shape[-1]
        batch = _broadcast_shape([q.shape[:-2], k.shape[:-2], v.shape[:-2]])
        assert len(batch) <= 2, "the kernel takes at most two batch dimensions"
        heads = batch[-1] if batch else 1
        programs = (batch[0] if len(batch) == 2 else 1) * heads
        assert programs < 65536, "batch × heads is launched as grid dimension 1, at most 65535"
        scores, output = (*batch, L, S), (*batch, L, DV)
{allocs}
        # The Triton interpreter (CPU tensors) multiplies bf16 wrongly: widen to fp32 there.
        cpu = q.device.type != "cuda"
        attention_kernel[(triton.cdiv(L, {block_m}), programs)](
            q, k, v, {pointer_args}
            *_strides(q, (*batch, L, D)), *_strides(k, (*batch, S, D)),
            *_strides(v, (*batch, S, DV)),
{stride_args}
            heads, L, {scale},
            # S is compile-time: the interpreter under NumPy 2.4 loops to no run-time bound.
            S=S, D=D, DV=DV,
            BLOCK_D=max(16, triton.next_power_of_2(D)),
            BLOCK_DV=max(16, triton.next_power_of_2(DV)),
            WIDEN=cpu, INTERPRET=cpu, BLOCK_M={block_m}, BLOCK_N={block_n},
            num_warps={num_warps}, num_stages={num_stages},
        )
        return {returns}


def _strides(t, shape):
    """`t`'s strides broadcast to `shape`, padded to (batch, head, row, column)."""
    strides = t.expand(shape).stride()
    return (0,) * (4 - len(strides)) + tuple(strides)
'''

# A step over BLOCK_N keys: the scores' tile and its logits, then V's tile weighed by P.
_STEP = '''cols = start + tl.arange(0, BLOCK_N)
col_ok = cols < S
kt = tl.load(k_ptr + b * k_sb + h * k_sh + dq[:, None] * k_sd + cols[None, :] * k_sn,
             mask=(dq < D)[:, None] & col_ok[None, :], other=0.0)
if WIDEN:
    kt = kt.to(tl.float32)
s = tl.dot(q, kt{precision})
{operands}
{scores}
{weights}
vt = tl.load(v_ptr + b * v_sb + h * v_sh + cols[:, None] * v_sn + dv[None, :] * v_sd,
             mask=col_ok[:, None] & (dv < DV)[None, :], other=0.0)
if WIDEN:
    vt = vt.to(tl.float32)
{accumulate}'''

# How P weighs V, each (weights, accumulate, finish). The online softmax: P from the running
# maximum, the accumulator rescaled when it grows, divided by the row's sum at the end.
_SOFTMAX = ('''x = tl.where(col_ok[None, :], {logits}, float("-inf"))
m_new = tl.maximum(m_i, tl.max(x, 1))
# A row with no unmasked logit yet subtracts 0, so that its exp is 0 rather than NaN.
m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)
alpha = tl.exp(m_i - m_ref)
p = tl.exp(x - m_ref[:, None])
l_i = l_i * alpha + tl.sum(p, 1)''',
            "acc = acc * alpha[:, None] + tl.dot(p.to(vt.dtype), vt{precision})\nm_i = m_new",
            "o = tl.where(l_i[:, None] > 0.0, acc / tl.where(l_i > 0.0, l_i, 1.0)[:, None], "
            "{empty})")
# Weights that are the logits themselves (no softmax): P·V accumulates as it comes.
_PLAIN = ("p = tl.where(col_ok[None, :], {logits}, 0.0)",
          "acc = acc + tl.dot(p.to(vt.dtype), vt{precision})", "o = acc")

_LOAD = ("{name} = tl.load({name}_ptr + b * {name}_sb + h * {name}_sh + rows[:, None] * {name}_sm"
         " + {cols}[None, :] * {name}_sn, mask=row_ok[:, None] & {ok}, other=0).to(tl.float32)")


def _load(name: str, over: str) -> str:
    if over == SCORES:
        return _LOAD.format(name=name, cols="cols", ok="col_ok[None, :]")
    return _LOAD.format(name=name, cols="dv", ok="(dv < DV)[None, :]")


def write_attention(graph: SiteGraph, config: AttentionConfig) -> str:
    """The ModelNew source computing the attention site `graph` with one Triton kernel."""
    plan = read_plan(graph)
    if config.block_m < 16 or config.block_n < 16:
        raise Unsupported("tl.dot needs blocks of at least 16 queries and 16 keys")
    rank = len(graph.info(plan.q).shape)
    if not 2 <= rank <= 4:
        raise Unsupported(f"Q of rank {rank}: the kernel takes at most two batch dimensions")
    head = max(graph.info(plan.q).shape[-1], graph.info(plan.v).shape[-1])
    if head > MAX_HEAD:
        raise Unsupported(f"head dimension {head}, over {MAX_HEAD}: a program holds a query "
                          "tile's whole accumulator and each key tile in registers, which would "
                          "spill (Triton compiled such a kernel for minutes on sm_90)")
    needed = shared_bytes(graph, plan, config)
    if needed > MAX_DYNAMIC_SHARED:
        raise Unsupported(f"{config.describe()} keeps at least {needed // 1024} KiB in shared "
                          f"memory, more than sm_90's {MAX_DYNAMIC_SHARED // 1024}: fewer "
                          "stages or smaller tiles")
    operands = [f"x{i}" for i in range(len(plan.operands))]
    outs = [f"out{k}" for k in range(len(plan.outputs))]
    precision = dot_precision(plan.dtype, config.precision)
    weights, accumulate, finish = _SOFTMAX if plan.normalized else _PLAIN
    step = _STEP.format(
        precision=precision, weights=weights.format(logits=plan.logits),
        accumulate=accumulate.format(precision=precision),
        operands="\n".join(_load(n, over) for n, (_, over) in zip(operands, plan.operands,
                                                                    strict=True)
                           if over == SCORES),
        scores="\n".join(plan.score_lines))
    step = "\n".join(line for line in step.split("\n") if line.strip())
    epilogue = [_load(n, over) for n, (_, over) in zip(operands, plan.operands, strict=True)
                if over == OUTPUT] + plan.epilogue_lines
    stores = [f"tl.store({o}_ptr + b * {o}_sb + h * {o}_sh + rows[:, None] * {o}_sm "
              f"+ dv[None, :] * {o}_sd, {value}.to({tl_dtype(dtype)}),\n"
              f"         mask=row_ok[:, None] & (dv < DV)[None, :])"
              for o, (value, dtype) in zip(outs, plan.outputs, strict=True)]
    bound = ["hi = S"]
    if plan.causal_offset is not None:
        bound = [f"# Keys past query + {plan.causal_offset} are masked for every query here.",
                 f"hi = tl.minimum(S, tl.maximum((pid_m + 1) * BLOCK_M + {plan.causal_offset}, "
                 "0))"]
    lines = step.split("\n")
    interpreted = ["if start < hi:", *indent(lines, 4).split("\n")]
    steps = ["for start in range(0, hi, BLOCK_N):", *indent(lines, 4).split("\n")]
    if plan.bands:
        # Tiles wholly on or below the lowest band's diagonal read each band as its low value:
        # no mask to compute there.
        inside = step
        for expression, low in plan.bands:
            inside = inside.replace(expression, low)
        bound += ["inside = tl.minimum(hi, tl.maximum(pid_m * BLOCK_M + "
                  f"{plan.inner_offset} + 1, 0) // BLOCK_N * BLOCK_N)"]
        inside_lines = indent(inside.split("\n"), 4).split("\n")
        interpreted = ["if start < inside:", *inside_lines, "el" + interpreted[0],
                       *interpreted[1:]]
        steps = ["for start in range(0, inside, BLOCK_N):", *inside_lines,
                 "for start in range(inside, hi, BLOCK_N):", *steps[1:]]
    names = operands + outs
    source = _SOURCE.format(
        ops=" → ".join(op.name for op in graph.ops), config=config.describe(),
        pointer_params=indent([f"{n}_ptr," for n in names], 4),
        stride_params=indent([f"{n}_sb, {n}_sh, {n}_sm, {n}_sn," for n in operands]
                             + [f"{o}_sb, {o}_sh, {o}_sm, {o}_sd," for o in outs], 4),
        bound=indent(bound, 4), interpreted_steps=indent(interpreted, 12),
        steps=indent(steps, 8),
        finish="    " + finish.format(empty=plan.empty),
        epilogue=indent("\n".join(epilogue).split("\n"), 4) if epilogue else "",
        stores=indent("\n".join(stores).split("\n"), 4),
        params=", ".join(f"in{i}" for i in range(len(graph.inputs))),
        q=plan.q.name, k=f"{plan.k.name}.transpose(-2, -1)" if plan.k_transposed else plan.k.name,
        v=plan.v.name,
        allocs=indent([f"{o} = torch.empty(output, device=q.device, dtype={dtype})"
                       for o, (_, dtype) in zip(outs, plan.outputs, strict=True)], 8),
        pointer_args="".join(f"{ref.name}, " for ref, _ in plan.operands)
        + "".join(f"{o}, " for o in outs),
        stride_args=indent([f"*_strides({ref.name}, {over}),"
                            for ref, over in plan.operands]
                           + [f"*_strides({o}, output)," for o in outs], 12),
        scale=plan.scale or "1.0",
        block_m=config.block_m, block_n=config.block_n, num_warps=config.num_warps,
        num_stages=config.num_stages,
        returns=", ".join(outs),
    )
    source = "\n".join(line for line in source.split("\n") if line.strip() or not line)
    return with_jit_helpers(source + "\n\n" + BROADCAST_SHAPE_HELPER)


def attention_drafts(graph: SiteGraph) -> list[tuple[AttentionConfig, str]]:
    """Tiles by dtype, head dimension and keys: the shapes Triton's fused attention runs well
    at on Hopper (bench/NOTES.md has no attention figures yet: a GPU run ranks these)."""
    plan = read_plan(graph)
    head = graph.info(plan.q).shape[-1]
    keys = graph.info(plan.k).shape[-1 if plan.k_transposed else -2]
    warps = 8 if head > 64 else 4
    if plan.dtype != torch.float32:
        drafts = [(AttentionConfig(128, 64, warps, 3),
                   f"head dim {head}: 128 queries × 64 keys a step on the tensor cores, "
                   f"{warps} warps, 3 stages"),
                  (AttentionConfig(64, 64, 4, 3), "64 × 64 tiles: twice the programs")]
        if keys >= 1024:
            drafts.append((AttentionConfig(128, 128, 8, 3),
                           f"{keys} keys: 128-key steps rescale the accumulator half as often"))
        return drafts
    drafts = [(AttentionConfig(64, 32, 4, 2),
               "fp32 products on the CUDA cores: 64 × 32 tiles keep registers for the "
               "accumulator"),
              (AttentionConfig(64, 64, 4, 2), "fp32: 64 × 64 tiles, each key tile reused more")]
    # Two stages: the hi and lo halves of each tile at three stages pass Hopper's 227 KiB of
    # shared memory once a mask tile rides along.
    drafts.insert(0, (AttentionConfig(128, 64, warps, 2, precision="tf32x3"),
                      f"fp32: both products as three tf32 tensor-core products each (fp32's "
                      f"accuracy), 128 × 64 tiles, {warps} warps, 2 stages"))
    return drafts
