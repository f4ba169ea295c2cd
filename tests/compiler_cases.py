"""Sites the kernel compiler must handle, shared by its backends' tests: every reduction kind over
any axes, scans, norms, losses and elementwise chains, in fp32, fp16 and bf16 on odd shapes; and
how a backend's candidates are written and held against the problem's own Model."""

from __future__ import annotations

import importlib.util
import itertools
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from generators.compiler.lower import lower_problem
from generators.compiler.program import Program, plan_program
from generators.compiler.schedule import Schedule, drafts

PROBLEM = '''import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def forward(self, {args}):
        return {body}


def get_inputs():
    return [{inputs}]


def get_init_inputs():
    return []
'''
# Relative to the reference's scale, as the evaluator holds kernels (core.evaluate.correctness).
TOLERANCE = {torch.float32: 1e-4, torch.float16: 1e-2, torch.bfloat16: 1e-2}
# Beyond each kernel's drafts: a few rows a block, each row split over three programs, and a
# program per SM striding over the blocks (one program on the CPU, which counts one SM).
FORCED = (Schedule(2, 8, 4), Schedule(1, 8, 4, splits=3), Schedule(2, 8, 4, resident_per_sm=1))
# The CUDA tier's own: rows kept on chip between their walks, in shared memory (a row a block,
# two, and two striding) and in registers (a row a block, two striding), and on a GPU clusters:
# a row shared by two blocks, two rows a block shared by four with their inputs kept in either
# (and in vectors of 4), and a row shared by sixteen (launched through the driver:
# `core.runtime.cuda.DriverKernel`; the CPU's stand-in for CUDA runs no clusters).
KEPT = (Schedule(1, 8, 4, keep_row=True), Schedule(2, 8, 4, keep_row=True),
        Schedule(2, 8, 4, resident_per_sm=1, keep_row=True),
        Schedule(1, 8, 4, keep_row=True, held="registers"),
        Schedule(2, 8, 4, resident_per_sm=1, keep_row=True, held="registers"))
CLUSTERED = (Schedule(1, 8, 4, cluster_blocks=2),
             Schedule(2, 8, 4, cluster_blocks=4, keep_row=True),
             Schedule(2, 8, 4, cluster_blocks=4, keep_row=True, held="registers"),
             Schedule(1, 8, 4, cluster_blocks=16, keep_row=True),
             Schedule(2, 8, 4, cluster_blocks=4, keep_row=True, vector=4))
# On a GPU, rows shared by blocks anywhere on it, meeting at a barrier in global memory (a
# cooperative launch, which the CPU's stand-in does not run): three blocks a row keeping their
# shares (a column or a vector of 2 at a time), and four reading them again.
GRIDDED = (Schedule(1, 8, 4, grid_blocks=3, keep_row=True), Schedule(2, 8, 4, grid_blocks=4),
           Schedule(1, 8, 4, grid_blocks=3, keep_row=True, vector=2))
# The CUDA tier's vectors of consecutive columns: rows kept in shared memory and in registers,
# rows read again, and rows split over three programs, 4 and 2 columns a lane a step (cases whose
# innermost column dimension is no multiple of the width write their scalar twins).
VECTORED = (Schedule(1, 8, 4, keep_row=True, vector=4),
            Schedule(2, 8, 4, resident_per_sm=1, keep_row=True, held="registers", vector=2),
            Schedule(2, 16, 4, vector=4), Schedule(1, 8, 4, splits=3, vector=2))
DTYPES = {"fp32": "torch.float32", "fp16": "torch.float16", "bf16": "torch.bfloat16"}


@dataclass(frozen=True)
class Case:
    args: str
    body: str
    inputs: str

    @property
    def id(self) -> str:
        return f"{self.body} of {self.inputs}"


REDUCTIONS = ["sum", "mean", "amax", "amin", "prod", "var", "std"]
AXES = {"last": "-1", "middle": "1", "first": "0", "two": "(0, 2)", "all": "(0, 1, 2)"}


def _reduction(kind: str, axes: str) -> Case:
    call = f"torch.{kind}(x, dim={AXES[axes]})"
    if kind == "prod" and axes in ("two", "all"):
        call = f"torch.prod(x, dim={AXES[axes][-2]})"  # prod takes one dimension
    scale = "0.5 + torch.rand" if kind == "prod" else "torch.randn"
    return Case("x", call, f"{scale}(5, 7, 9)")


REDUCTION_CASES = [_reduction(kind, axes) for kind, axes in itertools.product(REDUCTIONS, AXES)]
FUSED_CASES = [Case("x", body, f"torch.randn(4, 11, 13, dtype={dtype})")
               for body in ["torch.sum(x, dim=1, keepdim=True) * 0.5 + x",
                            "torch.softmax(x, dim=-1)",
                            "torch.log_softmax(x, dim=1)",
                            "torch.logsumexp(x, dim=2)",
                            "F.layer_norm(x, x.shape[1:])"]
               for dtype in DTYPES.values()]
# A masked softmax: its max and sum in one walk (an online sum) over rows holding -inf.
FUSED_CASES.append(Case("x, m", "torch.softmax(x.masked_fill(m, float('-inf')), dim=-1)",
                        "torch.randn(6, 40), torch.rand(6, 40) > 0.5"))
# Few distinct values, so that ties are common and the first one must win.
ARG_CASES = [Case("x", f"torch.{kind}(x, dim={dim})", "torch.randint(0, 4, (6, 9, 5)).float()")
             for kind in ("argmax", "argmin") for dim in (0, 1, 2)]
SCAN_CASES = [
    Case("x", "torch.cumsum(x, dim=1)", "torch.randn(5, 37)"),
    Case("x", "torch.cumsum(x, dim=0)", "torch.randn(29, 3)"),
    Case("x, m", "torch.cumsum(x * m, dim=1)", "torch.randn(4, 21), torch.rand(4, 21) > 0.5"),
    Case("x", "torch.cumprod(x, dim=-1)", "0.9 + 0.2 * torch.rand(3, 17)"),
    Case("x", "torch.cummax(x, dim=1)[0]", "torch.randn(5, 37)"),
    Case("x", "torch.cummin(x, dim=0).values", "torch.randn(29, 3)"),
    Case("x", "torch.logcumsumexp(x, dim=1)", "torch.randn(4, 21) * 4"),
]
# Running values the CUDA tier does not scan (its scans are sums).
TRITON_ONLY_SCANS = ("cumprod", "cummax", "cummin", "logcumsumexp")
NORM_CASES = [
    Case("x, w, b", "F.layer_norm(x, (24,), w, b)",
         "torch.randn(9, 24), torch.randn(24), torch.randn(24)"),
    Case("x", "F.layer_norm(x, (3, 5, 7))", "torch.randn(4, 3, 5, 7)"),
    Case("x, w", "x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w",
         "torch.randn(6, 40), torch.randn(40)"),
    # F.rms_norm's decomposition adds its epsilon in place, on its own temporary.
    Case("x, w", "F.rms_norm(x, (40,), w, 1e-6)",
         "torch.randn(6, 40).bfloat16(), torch.randn(40).bfloat16()"),
    Case("x, w, b", "F.group_norm(x, 3, w, b)",
         "torch.randn(2, 12, 5, 3), torch.randn(12), torch.randn(12)"),
    Case("x", "F.instance_norm(x)", "torch.randn(3, 4, 7, 5)"),
    Case("x, w, b", "F.batch_norm(x, None, None, w, b, training=True)",
         "torch.randn(6, 5, 3, 3), torch.randn(5), torch.randn(5)"),
    Case("x", "x / torch.norm(x, p=2, dim=1, keepdim=True)", "torch.randn(7, 33)"),
    Case("x", "x / torch.sum(torch.abs(x), dim=1, keepdim=True)", "torch.randn(7, 33)"),
    Case("x", "x / torch.norm(x, p='fro')", "torch.randn(5, 6, 7)"),
    Case("x", "torch.max(x, dim=1)", "torch.randn(8, 19)"),
    # Channels-last inputs: each walk goes along memory (the channels innermost), not along
    # the view (a group norm's groups, then a 3-d convolution's output normed and averaged).
    Case("x, w, b", "F.group_norm(x, 3, w, b)",
         "torch.randn(2, 12, 5, 3).to(memory_format=torch.channels_last), torch.randn(12), "
         "torch.randn(12)"),
    Case("x, w, b", "F.group_norm(x, 4, w, b).mean(dim=[1, 2, 3, 4])",
         "torch.randn(2, 12, 3, 4, 5).to(memory_format=torch.channels_last_3d), "
         "torch.randn(12), torch.randn(12)"),
    Case("x", "x.sum(dim=(1, 2, 3)) + x.amax(dim=(1, 2, 3))",
         "torch.randn(3, 6, 5, 7).to(memory_format=torch.channels_last)"),
    # A reduction over the channels of a norm's output whose groups are channels: the norm's
    # statistics in the channel loop are the loop's channel's, not the row's.
    Case("x, w, b", "torch.logsumexp(x + F.group_norm(x, 6, w, b), dim=1, keepdim=True)",
         "torch.randn(3, 6, 4, 5), torch.randn(6), torch.randn(6)"),
    # The same over groups of two channels: the norm's statistics into buffers, then the
    # logsumexp's max and sum in one kernel reading the input again.
    Case("x, w, b", "torch.logsumexp(x + torch.tanh(F.group_norm(x, 3, w, b)), dim=1, "
                    "keepdim=True)", "torch.randn(2, 6, 4, 5), torch.randn(6), torch.randn(6)"),
    # The tokens' mean of a layer norm's activated output: each token's statistics, then the
    # mean over the tokens recomputing the norm.
    Case("x", "torch.relu(F.layer_norm(x, (7,))).mean(dim=1)", "torch.randn(3, 5, 7)"),
]
LOSS_CASES = [
    Case("p, t", "torch.mean((p - t) ** 2)", "torch.randn(13, 17), torch.randn(13, 17)"),
    Case("p, t", "F.smooth_l1_loss(p, t)", "torch.randn(13, 17), torch.randn(13, 17)"),
    Case("p, t", "F.huber_loss(p, t, delta=0.5)", "torch.randn(13, 17), torch.randn(13, 17)"),
    Case("p, t", "F.kl_div(torch.log(p), t, reduction='batchmean')",
         "torch.rand(6, 10) + 0.01, torch.rand(6, 10)"),
    Case("p, t", "torch.mean(torch.clamp(1 - p * t, min=0))",
         "torch.randn(37), torch.randint(0, 2, (37,)).float() * 2 - 1"),
    # A loss over rows that each need a log-softmax: two kernels, a buffer between them.
    Case("x, t", "F.cross_entropy(x, t)", "torch.randn(23, 10), torch.randint(0, 10, (23,))"),
    Case("x, t", "F.nll_loss(torch.log_softmax(x, 1), t, ignore_index=2)",
         "torch.randn(19, 7), torch.randint(0, 7, (19,))"),
    # Distances of rows, then their mean.
    Case("a, p, n", "F.triplet_margin_loss(a, p, n, margin=0.5)",
         "torch.randn(11, 19), torch.randn(11, 19), torch.randn(11, 19)"),
    Case("x, y", "torch.dist(x, y, 3)", "torch.randn(7, 13), torch.randn(7, 13)"),
    # Its decomposition fills an empty tensor through copy_.
    Case("x, y, s", "F.cosine_embedding_loss(x, y, s, margin=0.2)",
         "torch.randn(9, 15), torch.randn(9, 15), torch.randint(0, 2, (9,)).float() * 2 - 1"),
    Case("x, y, s", "F.margin_ranking_loss(x, y, s, margin=0.1)",
         "torch.randn(29), torch.randn(29), torch.randint(0, 2, (29,)).float() * 2 - 1"),
]
ELEMENTWISE_CASES = [
    Case("x", "F.gelu(x) * 2 - 1", "torch.randn(33, 45)"),
    Case("x, b", "torch.sigmoid(x + b) * x", "torch.randn(3, 8, 5), torch.randn(8, 1)"),
    Case("x, m", "torch.where(m, x, 0.0).sum(-1)",
         "torch.randn(9, 31), torch.rand(9, 31) > 0.3"),
    Case("x", "F.softplus(x).t().sum(1)", "torch.randn(30, 20)"),
]
# Sliding windows: pooling and depthwise convolution, with padding, strides and dilation.
WINDOW_CASES = [
    Case("x", "F.avg_pool2d(x, 3, 2, 1)", "torch.randn(1, 3, 7, 9)"),
    Case("x", "F.max_pool2d(x, 2, dilation=2, padding=1)", "torch.randn(1, 2, 7, 9)"),
    Case("x", "F.avg_pool3d(x, 2)", "torch.randn(2, 3, 4, 6, 6)"),
    Case("x", "F.max_pool1d(torch.relu(x), 3, 2)", "torch.randn(2, 3, 17)"),
    Case("x", "F.adaptive_avg_pool2d(x, (2, 3))", "torch.randn(2, 3, 8, 9)"),
    Case("x", "F.adaptive_max_pool2d(x, 2) * 2.0", "torch.randn(2, 3, 8, 6)"),
    Case("x, w, b", "F.relu(F.conv2d(x, w, b, stride=2, padding=1, groups=3))",
         "torch.randn(1, 3, 7, 8), torch.randn(3, 1, 3, 3), torch.randn(3)"),
]
# Rows whose innermost dimension takes vectors of 4: a group norm's per-channel weights read a
# column at a time beside its input's vectors, a softmax, and one in half precision (its loads
# a column at a time, the vector's columns still one lane's).
VECTOR_CASES = [
    Case("x, w, b", "F.group_norm(x, 2, w, b)",
         "torch.randn(2, 8, 3, 8), torch.randn(8), torch.randn(8)"),
    Case("x", "torch.softmax(x, dim=-1)", "torch.randn(6, 40)"),
    Case("x", "torch.log_softmax(x, dim=-1)", "torch.randn(6, 40, dtype=torch.float16)"),
    # Reductions alone (their loops walked in vectors, no column walk): ties, so that the
    # first of a vector's columns must win, and a boolean mask read a column at a time.
    Case("x", "torch.argmax(x, dim=-1)", "torch.randint(0, 4, (6, 40)).float()"),
    Case("x, m", "torch.where(m, x, 0.0).sum(-1)", "torch.randn(9, 32), torch.rand(9, 32) > 0.3"),
]
ALL_CASES = (REDUCTION_CASES + FUSED_CASES + ARG_CASES + SCAN_CASES + NORM_CASES + LOSS_CASES
             + ELEMENTWISE_CASES + WINDOW_CASES)


def load_module(path: Path, name: str) -> object:
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def compare(got: torch.Tensor, want: torch.Tensor, where: str) -> None:
    """`got` matches `want` within the dtype's tolerance, relative to the reference's scale;
    the failure names the worst element."""
    assert got.shape == want.shape and got.dtype == want.dtype, (
        f"{where}: {got.dtype}{tuple(got.shape)} against {want.dtype}{tuple(want.shape)}")
    got, want = got.cpu(), want.cpu()
    if not want.is_floating_point():
        assert torch.equal(got, want), f"{where}: {got.flatten()[:8]} against {want.flatten()[:8]}"
        return
    g, w = got.double(), want.double()
    assert torch.equal(g.isnan(), w.isnan()), f"{where}: NaN where the reference has none"
    finite = w.isfinite()
    scale = w[finite].abs().max() if finite.any() else torch.tensor(1.0)
    error = ((g - w).abs() / (scale + w.abs())).nan_to_num(0.0)
    worst = int(error.argmax())
    assert error.max() <= TOLERANCE[want.dtype], (
        f"{where}: worst relative error {float(error.max()):.3g} at flat index {worst}: got "
        f"{float(g.flatten()[worst])!r}, expected {float(w.flatten()[worst])!r}")


def write_problem(folder: Path, case: Case) -> tuple[Path, Program]:
    folder.mkdir(parents=True, exist_ok=True)
    problem = folder / "problem.py"
    problem.write_text(PROBLEM.format(args=case.args, body=case.body, inputs=case.inputs))
    return problem, plan_program(lower_problem(problem))


def schedules_of(program: Program, extra: tuple[Schedule, ...] = ()) -> list[Schedule]:
    """The largest kernel's drafts, then the forced schedules and `extra` (a tier's own)."""
    main = max(program.steps, key=lambda step: step.kernel.row_count * step.kernel.column_count)
    return [s for s, _ in drafts(main.kernel)] + list(FORCED) + list(extra)


Writer = Callable[[Program, Schedule, str], str]


def check(folder: Path, case: Case, write: Writer, device: str = "cpu",
          extra: tuple[Schedule, ...] = ()) -> None:
    """Each schedule's candidate for `case` (`schedules_of`) matches the problem's own Model on
    the same inputs, run on `device`; a schedule the case's kernels cannot take (a cluster for
    an elementwise kernel, say) writes a candidate already checked, which is not run twice."""
    problem, program = write_problem(folder, case)
    reference = load_module(problem, f"problem_{folder.name}")
    torch.manual_seed(0)
    values = reference.get_inputs()
    expected = reference.Model()(*values)
    values = [v.to(device) for v in values]
    checked: set[str] = set()
    for k, schedule in enumerate(schedules_of(program, extra)):
        source = write(program, schedule, case.body)
        kernels = source.split("\n", 1)[1]  # past the docstring's line, which names the schedule
        if kernels in checked:
            continue
        checked.add(kernels)
        path = folder / f"kernel_{k}.py"
        path.write_text(source)
        got = load_module(path, f"kernel_{folder.name}_{k}").ModelNew()(*values)
        pairs = (zip(got, expected, strict=True) if isinstance(expected, tuple)
                 else [(got, expected)])
        for i, (g, w) in enumerate(pairs):
            compare(g, w, f"{case.body} under {schedule.describe()}, output {i}")
