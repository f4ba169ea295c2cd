"""Tier-1 Triton for `matmul` sites: one tiled `tl.dot` kernel with the epilogue on the tile.

Each program owns a BLOCK_M × BLOCK_N tile of one matrix of the batch (program_id(1)). Tiles are
visited in groups of GROUP_M rows so neighbouring programs share A and B tiles in L2. The K loop
accumulates in fp32; the bias and every epilogue op run on the accumulator before one store.
Order-preserving views (`addmm → view → gelu`) keep each element's linear position, so an
epilogue input is read at the tile's (batch, m, n) through its strides after being broadcast to
the shape at which it joins the chain.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from core.runtime.tile_norms import TILE_NORMS, TileNorm, tile_norm
from generators.codegen import BROADCAST_SHAPE_HELPER, op_refs
from generators.op_table import channel_aligned_inputs
from generators.site_graph import Op, Ref, SiteGraph, Unsupported
from generators.triton.expressions import elementwise, tl_dtype, with_jit_helpers
from generators.triton.matmul_anchor import IDENTITY_VIEWS, SHAPE_VIEWS, prepare_operands, viewed
from generators.triton.matmul_norms import finish_lines
from generators.triton.matmul_prologue import split
from generators.triton.matmul_rows import RowReduction, partial_lines
from generators.triton.precision import DESCRIBED, check_precision, dot_precision

FLOAT_DTYPES = ("torch.float32", "torch.float16", "torch.bfloat16")
_EMPTY = "<empty placeholder>"  # marks a template line left with nothing; removed at the end


@dataclass(frozen=True)
class MatmulConfig:
    block_m: int = 128
    block_n: int = 128
    block_k: int = 32
    group_m: int = 8
    num_warps: int = 4
    num_stages: int = 3
    precision: str = "ieee"  # of fp32 operands (generators.triton.precision)

    def __post_init__(self) -> None:
        check_precision(self.precision)

    def describe(self) -> str:
        return (f"tiles {self.block_m}×{self.block_n}×{self.block_k}, GROUP_M {self.group_m}, "
                f"{self.num_warps} warps, {self.num_stages} stages{DESCRIBED[self.precision]}")


_SOURCE = '''"""Kiln rules kernel (triton, matmul): {ops}. {config}."""

import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def matmul_kernel(
    a_ptr, b_ptr,
{operand_params}
{out_params}
    M, N,
    a_sb, a_sm, a_sk,
    b_sb, b_sk, b_sn,
{stride_params}
    K: tl.constexpr,
{flag_params}
    WIDEN: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
):
    # Grouped order: GROUP_M row tiles sweep the columns together, reusing B tiles in L2.
    pid = tl.program_id(0)
    batch = tl.program_id(1).to(tl.int64)
    tiles_m = tl.cdiv(M, BLOCK_M)
    tiles_n = tl.cdiv(N, BLOCK_N)
    per_group = GROUP_M * tiles_n
    first_m = (pid // per_group) * GROUP_M
    group_rows = tl.minimum(tiles_m - first_m, GROUP_M)
    pid_m = first_m + (pid % per_group) % group_rows
    pid_n = (pid % per_group) // group_rows

    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    ks = tl.arange(0, BLOCK_K)
    # Rows and columns past the edge wrap onto valid ones: loads stay unmasked in M and N.
    a_tile = a_ptr + batch * a_sb + (rows % M)[:, None] * a_sm + ks[None, :] * a_sk
    b_tile = b_ptr + batch * b_sb + ks[:, None] * b_sk + (cols % N)[None, :] * b_sn
{prologue_tiles}
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        a = tl.load(a_tile, mask=ks[None, :] < K - k0, other=0.0)
{prologue}
        b = tl.load(b_tile, mask=ks[:, None] < K - k0, other=0.0)
        if WIDEN:
            a = a.to(tl.float32)
            b = b.to(tl.float32)
        acc = tl.dot(a, b, acc{precision})
        a_tile += BLOCK_K * a_sk
        b_tile += BLOCK_K * b_sk

    mask = (rows < M)[:, None] & (cols < N)[None, :]
{loads}
{body}
    out_offsets = batch * M * N + rows[:, None] * N + cols[None, :]
{stores}
{row_kernel}

class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, {params}):
{prepare}
        assert a.dtype == b.dtype and a.dtype in ({dtypes}), (
            f"the kernel takes two operands of one float dtype, got {{a.dtype}} and {{b.dtype}}")
        batch, M, K = a.shape
        N = b.shape[2]
        assert max(M * max(K, 1), max(K, 1) * N, M * N) < 2**31, (
            "one matrix of the batch must have fewer than 2**31 elements (32-bit offsets)")
        assert batch < 65536, "the batch is launched as grid dimension 1, at most 65535"
{prologue_operands}
{allocs}
{stages}
{operands}
        grid = (triton.cdiv(M, {block_m}) * triton.cdiv(N, {block_n}), batch)
        matmul_kernel[grid](
            a, b, {pointer_args},
            M, N,
            *a.stride(), *b.stride(),
{stride_args}
            # K is compile-time: the weight fixes it per site (one compile), and the Triton
            # interpreter under NumPy 2.4 cannot loop to a bound passed at run time.
            K=K,
{flag_args}
            # The Triton interpreter (CPU tensors) multiplies bf16 wrongly: widen to fp32 there.
            WIDEN=a.device.type != "cuda",
            BLOCK_M={block_m}, BLOCK_N={block_n}, BLOCK_K={block_k}, GROUP_M={group_m},
            num_warps={num_warps}, num_stages={num_stages},
        )
{row_launch}
        return {returns}
'''

# A broadcast epilogue operand (a bias is one row for every m) is loaded as one vector and
# widened in registers: a full [BLOCK_M, BLOCK_N] tile of it took 64 registers a thread at
# 128×256 tiles and spilled the accumulator on sm_90 (bench/NOTES.md, 2026-12-03, the
# matmul bias row).
_EPILOGUE_LOAD = """if {flag}_BROADCAST == 1:  # the same row for every m
    {name} = tl.load({name}_ptr + batch * {name}_sb + cols * {name}_sn,
                 mask=cols < N){widen}[None, :]
elif {flag}_BROADCAST == 2:  # the same column for every n
    {name} = tl.load({name}_ptr + batch * {name}_sb + rows * {name}_sm,
                 mask=rows < M){widen}[:, None]
else:
    {name} = tl.load({name}_ptr + batch * {name}_sb + rows[:, None] * {name}_sm
                 + cols[None, :] * {name}_sn, mask=mask){widen}"""


def _indent(lines: list[str], depth: int) -> str:
    return "\n".join(" " * depth + line for line in lines) if lines else _EMPTY


def fit_segments(config: MatmulConfig, norms: list[TileNorm]) -> MatmulConfig:
    """`config` with tiles that hold whole segments of every normalization the tiles finish: a
    row padded to a power of two is the tile's width; segments of a power of two fit a tile as
    wide as the widest, at least (fewer rows where that makes the tile larger than 128 × 256),
    with a warp for every 4096 values of the tile at least, as the drafts' 128 × 128 tiles on
    4 warps have (a wider tile on as few warps spills its accumulator)."""
    if not norms:
        return config
    padded = [n.block for n in norms if n.block != n.segment]
    block_n = padded[0] if padded else max(config.block_n, *(n.block for n in norms))
    block_m = max(16, min(config.block_m, 128 * 256 // block_n))
    warps = max(config.num_warps, block_m * block_n // 4096)
    return replace(config, block_n=block_n, block_m=block_m, num_warps=warps)


def write_triton_matmul(graph: SiteGraph, config: MatmulConfig) -> str:
    """The ModelNew source computing `graph` (prologue, anchor matmul, epilogue) with one Triton
    kernel, and a second one combining the tiles where the site reduces the output's rows."""
    if graph.family not in ("matmul", "conv"):
        raise Unsupported("the site is not a matmul site")
    top, anchor_op, prologue = split(graph)
    anchor = prepare_operands(graph, anchor_op)
    if prologue is not None and anchor.needs_broadcast:
        raise Unsupported("a prologue on a matmul that broadcasts its batch dimensions")
    dtype = anchor_op.out.dtype
    if not dtype.is_floating_point:
        raise Unsupported(f"a {dtype} matmul: the rules handle float operands")
    numel = anchor_op.out.numel

    # Each value's stage: a shape-only (meta) tensor in forward, viewed as the value is.
    stage: dict[Ref, str] = {Ref(top, False): "stage0"}
    stages = ["stage0 = torch.empty(shape, device='meta')"]
    value: dict[Ref, str] = {Ref(top, False): "v0"}
    operands: dict[tuple[int, str, bool], str] = {}  # (input, stage, channel) → its name
    operand_lines: list[str] = []
    loads: list[str] = []
    flags: list[str] = []  # per epilogue operand: which axis it is broadcast along
    body: list[str] = []

    def load(ref: Ref, at: str, channel: bool = False) -> str:
        """`ref` broadcast to stage `at` as [batch, M, N]: from its trailing dimensions, or
        with `channel` along the stage's dimension 1 (a conv's bias, batch norm's statistics)."""
        key = (ref.index, at, channel)
        if key not in operands:
            name = f"e{len(operands)}"
            operands[key] = name
            aligned = f"{ref.name}.view(-1, *[1] * ({at}.dim() - 2))" if channel else ref.name
            operand_lines.append(f"{name} = {aligned}.expand({at}.shape).reshape(batch, M, N)")
            # A mask stays boolean; every other operand joins the fp32 chain.
            widen = ".to(tl.float32)" if graph.inputs[ref.index].dtype != torch.bool else ""
            loads.extend(_EPILOGUE_LOAD.format(name=name, flag=name.upper(), widen=widen)
                         .splitlines())
            flags.append(name.upper())
        return operands[key]

    side: dict[Ref, Op] = {}  # values of the site's inputs alone (a mask made from a buffer)
    side_names: set[str] = set()

    def operand(ref: Ref, at: str, channel: bool = False) -> str:
        """An epilogue operand, broadcast to stage `at`: an input loaded there, or a value of
        inputs alone computed there from its own inputs loaded there."""
        if ref.is_input:
            kind = graph.inputs[ref.index].dtype
            if not (kind.is_floating_point or kind == torch.bool):
                raise Unsupported(f"input {ref.name} is {kind}")
            return load(ref, at, channel)
        name = f"w{ref.index}_{at}"
        if name not in side_names:
            op = side[ref]
            local = {r: operand(r, at) for r in op_refs(op)}
            body.append(f"{name} = {elementwise(op, local)}")
            side_names.add(name)
        return name

    accumulate = "acc" if anchor.alpha == 1 else f"acc * {float(anchor.alpha)!r}"
    if anchor.bias is not None:
        bias = load(anchor.bias, "stage0", anchor.channel_bias)
        scaled = bias if anchor.beta == 1 else f"{float(anchor.beta)!r} * {bias}"
        accumulate = f"{accumulate} + {scaled}"
    body.append(f"v0 = {accumulate}")

    rows: RowReduction | None = None  # the reduction over the output's rows, if the site has one
    norms: list[TileNorm] = []  # the normalizations the tiles finish
    for i, op in enumerate(graph.ops[top + 1:], start=top + 1):
        here = Ref(i, False)
        chain = [r for r in op.args if isinstance(r, Ref) and not r.is_input]
        if rows is not None and any(r in rows.value for r in chain):
            rows.add(i, op)
            continue
        if op.name in TILE_NORMS and chain and chain[0] == op.args[0]:
            norm = tile_norm(op.name, graph.info(chain[0]).shape, op.args, dict(op.kwargs),
                             op.out.dtype)
            if norm is None or graph.info(chain[0]).numel != numel:
                raise Unsupported(f"{op.name} is not one the matmul's tiles can finish alone")
            at = stage[chain[0]]
            affine: list[str | None] = []
            for r in (norm.weight, norm.bias):
                if r is not None and not (isinstance(r, Ref) and (r.is_input or r in side)):
                    raise Unsupported(f"{op.name} with a weight or bias the site computes")
                affine.append(None if r is None else operand(r, at))
            body.extend(finish_lines(i, norm, value[chain[0]], *affine))
            value[here], stage[here] = f"v{i}", at
            norms.append(norm)
            continue
        if op.kind.value == "reduction":
            if rows is not None:
                raise Unsupported("a second reduction of the matmul's output")
            rows = RowReduction.start(graph, i, stage)
            continue
        if not chain and op.kind.value == "pointwise" and here not in graph.outputs:
            side[here] = op  # computed where the chain reads it, at that stage's shape
            continue
        if op.out.numel != numel or not chain:
            raise Unsupported(f"{op.name} is not an epilogue on the matmul's output")
        at = stage[chain[0]]
        if op.name in SHAPE_VIEWS:
            if chain[0] != op.args[0]:
                raise Unsupported(f"{op.name} of a value the site reads from outside")
            stages.append(f"stage{i} = {viewed(op, at)}")
            stage[here], value[here] = f"stage{i}", value[chain[0]]
            continue
        if op.name in IDENTITY_VIEWS:
            stage[here], value[here] = at, value[chain[0]]
            continue
        if op.kind.value != "pointwise":
            raise Unsupported(f"{op.name} is not elementwise")
        if tuple(op.out.shape) != tuple(graph.info(chain[0]).shape):
            raise Unsupported(f"{op.name} broadcasts the matmul's output to a larger shape")
        channel = channel_aligned_inputs(op)
        for ref in op_refs(op):
            if ref.is_input or ref in side:
                value[ref] = operand(ref, at, ref in channel)
        body.append(f"v{i} = {elementwise(op, value)}")
        value[here], stage[here] = f"v{i}", at

    config = fit_segments(config, norms)
    row_outputs = [ref for ref in graph.outputs if rows is not None and ref in rows.value]
    tile_outputs = [ref for ref in graph.outputs if ref not in row_outputs]
    for ref in tile_outputs:
        if graph.info(ref).numel != numel:
            raise Unsupported("an output that is not the matmul's tile")
    out_dtypes = [graph.info(ref).dtype for ref in tile_outputs]
    stores = [f"tl.store(out{k}_ptr + out_offsets, {value[ref]}.to({tl_dtype(out_dtype)}), "
              "mask=mask)" for k, (ref, out_dtype) in enumerate(zip(tile_outputs, out_dtypes,
                                                                      strict=True))]
    allocs = [f"out{k} = torch.empty((batch, M, N), device=a.device, dtype={out_dtype})"
              for k, out_dtype in enumerate(out_dtypes)]
    out_pointers = [f"out{k}" for k in range(len(tile_outputs))]
    row_kernel, row_launch = "", []
    if rows is not None:
        stores += ["# This tile's share of each row's reduction: one partial value a row.",
                   *partial_lines(rows.kind, value[rows.source]),
                   "tl.store(part_ptr + (batch * M + rows) * tiles_n + pid_n, part, "
                   "mask=rows < M)"]
        allocs += ["rows_total = batch * M",
                   f"part = torch.empty((rows_total, triton.cdiv(N, {config.block_n})), "
                   "device=a.device, dtype=torch.float32)"]
        out_pointers.append("part")
        row_kernel = rows.kernel(row_outputs)
        row_launch = rows.launch(row_outputs, config.block_n)
        stages += rows.stages
    returns = [f"row_out{row_outputs.index(ref)}.view({rows.stage[ref]}.shape)"
               if rows is not None and ref in row_outputs else
               f"out{tile_outputs.index(ref)}.view({stage[ref]}.shape)" for ref in graph.outputs]
    names = list(operands.values())
    precision = dot_precision(dtype, config.precision)
    source = _SOURCE.format(
        ops=" → ".join(op.name for op in graph.ops),
        config=config.describe(),
        operand_params=_indent([f"{n}_ptr," for n in names], 4),
        out_params=_indent([f"{p}_ptr," for p in out_pointers], 4),
        stride_params=_indent([f"{n}_sb, {n}_sm, {n}_sn," for n in names]
                              + (prologue.params() if prologue else []), 4),
        precision=precision,
        flag_params=_indent([f"{flag}_BROADCAST: tl.constexpr," for flag in flags], 4),
        flag_args=_indent([f"{flag}_BROADCAST=1 if {flag.lower()}.stride(1) == 0 else 2 if "
                           f"{flag.lower()}.stride(2) == 0 else 0," for flag in flags], 12),
        loads=_indent(loads, 4),
        body=_indent(body, 4),
        stores=_indent(stores, 4),
        params=", ".join(f"in{i}" for i in range(len(graph.inputs))),
        prepare=_indent(anchor.prepare, 8),
        dtypes=", ".join(FLOAT_DTYPES),
        allocs=_indent(allocs, 8),
        stages=_indent(stages, 8),
        operands=_indent(operand_lines, 8),
        pointer_args=", ".join(names + out_pointers),
        stride_args=_indent(([", ".join(f"*{n}.stride()" for n in names) + ","] if names else [])
                            + (prologue.args() if prologue else []), 12),
        prologue_tiles=_indent(prologue.tiles() if prologue else [], 4),
        prologue=_indent(prologue.loop_lines() if prologue else [], 8),
        prologue_operands=_indent(prologue.forward_lines() if prologue else [], 8),
        block_m=config.block_m, block_n=config.block_n, block_k=config.block_k,
        group_m=config.group_m, num_warps=config.num_warps, num_stages=config.num_stages,
        returns=", ".join(returns),
        row_kernel=(prologue.kernels() if prologue else "") + row_kernel,
        row_launch=_indent(row_launch, 8),
    )
    source = "\n".join(line for line in source.split("\n") if line.strip() != _EMPTY)
    if anchor.needs_broadcast:
        source += "\n\n" + BROADCAST_SHAPE_HELPER
    return with_jit_helpers(source)
