"""The kernel compiler against PyTorch: every reduction kind over any axes, scans, norms, losses
and elementwise chains, in fp32, fp16 and bf16 on odd shapes, each written under several
schedules (its drafts, looped, and split over programs) and run under the Triton interpreter."""

from __future__ import annotations

import importlib.util
import itertools
from pathlib import Path

import pytest
import torch

from generators.compiler.lower import lower_problem
from generators.compiler.program import plan_program
from generators.compiler.schedule import Schedule, drafts
from generators.triton.program import write_program

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
FORCED = (Schedule(2, 8, 4), Schedule(1, 8, 4, splits=3))
# Masked lanes beyond a row's end compute on zeros (log(0), 0 / 0) before the mask drops them.
pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")
DTYPES = {"fp32": "torch.float32", "fp16": "torch.float16", "bf16": "torch.bfloat16"}


def _module(path: Path, name: str) -> object:
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _compare(got: torch.Tensor, want: torch.Tensor, where: str) -> None:
    assert got.shape == want.shape and got.dtype == want.dtype, (
        f"{where}: {got.dtype}{tuple(got.shape)} against {want.dtype}{tuple(want.shape)}")
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


def check(tmp_path: Path, args: str, body: str, inputs: str) -> None:
    """Each schedule's kernel for `body` matches the problem's own Model on the same inputs."""
    folder = tmp_path / "site"
    folder.mkdir()
    problem = folder / "problem.py"
    problem.write_text(PROBLEM.format(args=args, body=body, inputs=inputs))
    program = plan_program(lower_problem(problem))
    main = max(program.steps, key=lambda step: step.kernel.row_count * step.kernel.column_count)
    reference = _module(problem, f"problem_{tmp_path.name}")
    torch.manual_seed(0)
    values = reference.get_inputs()
    expected = reference.Model()(*values)
    schedules = [s for s, _ in drafts(main.kernel)] + list(FORCED)
    for k, schedule in enumerate(schedules):
        path = folder / f"kernel_{k}.py"
        path.write_text(write_program(program, schedule, body))
        got = _module(path, f"kernel_{tmp_path.name}_{k}").ModelNew()(*values)
        pairs = (zip(got, expected, strict=True) if isinstance(expected, tuple)
                 else [(got, expected)])
        for i, (g, w) in enumerate(pairs):
            _compare(g, w, f"{body} under {schedule.describe()}, output {i}")


REDUCTIONS = ["sum", "mean", "amax", "amin", "prod", "var", "std"]
AXES = {"last": "-1", "middle": "1", "first": "0", "two": "(0, 2)", "all": "(0, 1, 2)"}


@pytest.mark.parametrize("kind, axes", list(itertools.product(REDUCTIONS, AXES)))
def test_reductions_over_any_axes(tmp_path, kind, axes):
    call = f"torch.{kind}(x, dim={AXES[axes]})"
    if kind == "prod" and axes in ("two", "all"):
        call = f"torch.prod(x, dim={AXES[axes][-2]})"  # prod takes one dimension
    scale = "0.5 + torch.rand" if kind == "prod" else "torch.randn"
    check(tmp_path, "x", call, f"{scale}(5, 7, 9)")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("body", [
    "torch.sum(x, dim=1, keepdim=True) * 0.5 + x",
    "torch.softmax(x, dim=-1)",
    "torch.log_softmax(x, dim=1)",
    "torch.logsumexp(x, dim=2)",
    "F.layer_norm(x, x.shape[1:])",
])
def test_fused_reductions_in_every_dtype(tmp_path, body, dtype):
    check(tmp_path, "x", body, f"torch.randn(4, 11, 13, dtype={DTYPES[dtype]})")


@pytest.mark.parametrize("kind", ["argmax", "argmin"])
@pytest.mark.parametrize("dim", [0, 1, 2])
def test_arg_reductions_take_the_first_extreme(tmp_path, kind, dim):
    # Few distinct values, so that ties are common and the first one must win.
    check(tmp_path, "x", f"torch.{kind}(x, dim={dim})", "torch.randint(0, 4, (6, 9, 5)).float()")


@pytest.mark.parametrize("body, inputs", [
    ("torch.cumsum(x, dim=1)", "torch.randn(5, 37)"),
    ("torch.cumsum(x, dim=0)", "torch.randn(29, 3)"),
    ("torch.cumsum(x * m, dim=1)", "torch.randn(4, 21), torch.rand(4, 21) > 0.5"),
    ("torch.cumprod(x, dim=-1)", "0.9 + 0.2 * torch.rand(3, 17)"),
])
def test_scans(tmp_path, body, inputs):
    check(tmp_path, "x, m" if " m" in body else "x", body, inputs)


@pytest.mark.parametrize("args, body, inputs", [
    ("x, w, b", "F.layer_norm(x, (24,), w, b)", "torch.randn(9, 24), torch.randn(24), "
                                                "torch.randn(24)"),
    ("x", "F.layer_norm(x, (3, 5, 7))", "torch.randn(4, 3, 5, 7)"),
    ("x, w", "x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w",
     "torch.randn(6, 40), torch.randn(40)"),
    ("x, w, b", "F.group_norm(x, 3, w, b)", "torch.randn(2, 12, 5, 3), torch.randn(12), "
                                            "torch.randn(12)"),
    ("x", "F.instance_norm(x)", "torch.randn(3, 4, 7, 5)"),
    ("x, w, b", "F.batch_norm(x, None, None, w, b, training=True)",
     "torch.randn(6, 5, 3, 3), torch.randn(5), torch.randn(5)"),
    ("x", "x / torch.norm(x, p=2, dim=1, keepdim=True)", "torch.randn(7, 33)"),
    ("x", "x / torch.sum(torch.abs(x), dim=1, keepdim=True)", "torch.randn(7, 33)"),
    ("x", "x / torch.norm(x, p='fro')", "torch.randn(5, 6, 7)"),
    ("x", "torch.max(x, dim=1)", "torch.randn(8, 19)"),
])
def test_norms_and_their_epilogues(tmp_path, args, body, inputs):
    check(tmp_path, args, body, inputs)


@pytest.mark.parametrize("args, body, inputs", [
    ("p, t", "torch.mean((p - t) ** 2)", "torch.randn(13, 17), torch.randn(13, 17)"),
    ("p, t", "F.smooth_l1_loss(p, t)", "torch.randn(13, 17), torch.randn(13, 17)"),
    ("p, t", "F.huber_loss(p, t, delta=0.5)", "torch.randn(13, 17), torch.randn(13, 17)"),
    ("p, t", "F.kl_div(torch.log(p), t, reduction='batchmean')",
     "torch.rand(6, 10) + 0.01, torch.rand(6, 10)"),
    ("p, t", "torch.mean(torch.clamp(1 - p * t, min=0))",
     "torch.randn(37), torch.randint(0, 2, (37,)).float() * 2 - 1"),
    # A loss over rows that each need a log-softmax: two kernels, a buffer between them.
    ("x, t", "F.cross_entropy(x, t)", "torch.randn(23, 10), torch.randint(0, 10, (23,))"),
    ("x, t", "F.nll_loss(torch.log_softmax(x, 1), t, ignore_index=2)",
     "torch.randn(19, 7), torch.randint(0, 7, (19,))"),
])
def test_losses_over_a_whole_tensor(tmp_path, args, body, inputs):
    check(tmp_path, args, body, inputs)


@pytest.mark.parametrize("args, body, inputs", [
    ("x", "F.gelu(x) * 2 - 1", "torch.randn(33, 45)"),
    ("x, b", "torch.sigmoid(x + b) * x", "torch.randn(3, 8, 5), torch.randn(8, 1)"),
    ("x, m", "torch.where(m, x, 0.0).sum(-1)", "torch.randn(9, 31), torch.rand(9, 31) > 0.3"),
    ("x", "F.softplus(x).t().sum(1)", "torch.randn(30, 20)"),
])
def test_elementwise_chains_and_broadcasts(tmp_path, args, body, inputs):
    check(tmp_path, args, body, inputs)
