"""Compiled conv sites: cuDNN's convolution called without its bias, the bias and everything
after it one kernel (`generators.compiler.library`)."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest
import torch

from core.evaluate import EvalConfig, evaluate
from generators.compiler.schedule import Schedule
from generators.rules import RulesGenerator
from generators.site_graph import Unsupported, load_site_graph
from generators.triton.program import write_compiled
from tests.kernel_checks import assert_matches, run_beside_problem
from tests.test_site_problems import import_problem

BN = "torch.nn.functional.batch_norm(v, mean, var, g, b, False, 0.1, 1e-5)"


def write_problem(path: Path, conv: str, epilogue: list[str], shapes: dict[str, str],
                  dtype: torch.dtype) -> Path:
    """`shapes` names every forward argument; `var` is drawn positive."""
    draws = ", ".join(f"(torch.rand({s}) + 0.5).to({dtype})" if name == "var"
                      else f"torch.randn({s}).to({dtype})" for name, s in shapes.items())
    lines = [f"        v = {conv}"] + [f"        v = {e}" for e in epilogue]
    path.write_text(
        "import torch\nimport torch.nn as nn\n\n\nclass Model(nn.Module):\n"
        f"    def forward(self, {', '.join(shapes)}):\n" + "\n".join(lines)
        + "\n        return v\n\n\n"
        f"def get_inputs():\n    return [{draws}]\n\n\ndef get_init_inputs():\n    return []\n")
    return path


def norm_mean_problem(path: Path, x: str, out_channels: int, groups: int,
                      dtype: torch.dtype = torch.float32) -> Path:
    """Level 2's 23 at the sizes given: a 3×3×3 convolution of `x` ("N, C, D, H, W"), a group
    norm of its output, the mean of that a sample."""
    channels = x.split(",")[1].strip()
    return write_problem(
        path, "torch.nn.functional.conv3d(x, w, cb)",
        [f"torch.nn.functional.group_norm(v, {groups}, g, b)", "v.mean(dim=[1, 2, 3, 4])"],
        {"x": x, "w": f"{out_channels}, {channels}, 3, 3, 3", "cb": str(out_channels),
         "g": str(out_channels), "b": str(out_channels)}, dtype)


def write(problem_path: Path, schedule: Schedule) -> str:
    return write_compiled(load_site_graph(problem_path), schedule)


def check(problem_path: Path, schedule: Schedule) -> str:
    source = write(problem_path, schedule)
    actual, expected = run_beside_problem(source, problem_path, 5)
    assert_matches(actual, expected, problem_path.read_text())
    return source


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_conv_batch_norm_residual_relu_like_resnet(dtype, tmp_path):
    path = write_problem(
        tmp_path / "problem.py", "torch.nn.functional.conv2d(x, w, None, 1, 1)",
        [BN, "v + r", "torch.relu(v)"],
        {"x": "2, 3, 7, 9", "w": "5, 3, 3, 3", "mean": "5", "var": "5", "g": "5", "b": "5",
         "r": "2, 5, 7, 9"}, dtype)
    source = check(path, Schedule(4, 64, 4))
    assert "in7 = torch.nn.functional.conv2d(in0, in1, None, [1, 1], [1, 1], [1, 1], 1)" in source


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_conv_bias_is_fused_into_the_epilogue(dtype, tmp_path):
    path = write_problem(
        tmp_path / "problem.py", "torch.nn.functional.conv2d(x, w, cb, 2, 1, 1, 2)",
        ["v * 0.5", "torch.nn.functional.silu(v)"],
        {"x": "3, 4, 16, 12", "w": "6, 2, 3, 3", "cb": "6"}, dtype)
    source = check(path, Schedule(2, 16, 2))
    assert "in3 = torch.nn.functional.conv2d(in0, in1, None, [2, 2], [1, 1], [1, 1], 2)" in source
    # The bias is added in the kernel, read once a row of the conv's output (a channel).
    assert "tl.load(in2 + " in source and "mask=rmask" in source


def test_conv1d_and_conv_transpose_epilogues(tmp_path):
    conv1d = write_problem(
        tmp_path / "conv1d.py", "torch.nn.functional.conv1d(x, w, cb, padding=2)",
        ["torch.tanh(v)"], {"x": "2, 3, 13", "w": "4, 3, 5", "cb": "4"}, torch.float32)
    check(conv1d, Schedule(2, 16, 4))
    transposed = write_problem(
        tmp_path / "transposed.py", "torch.nn.functional.conv_transpose2d(x, w, cb, 2)",
        ["torch.nn.functional.leaky_relu(v, 0.1)"],
        {"x": "1, 3, 5, 4", "w": "3, 2, 3, 3", "cb": "2"}, torch.float32)
    check(transposed, Schedule(1, 128, 4))


@pytest.mark.parametrize("conv,shapes", [
    # Volumes (level 2's Conv3d problems), strided and dilated.
    ("torch.nn.functional.conv3d(x, w, cb, 1, 1, 2)",
     {"x": "2, 3, 6, 7, 5", "w": "4, 3, 3, 3, 3", "cb": "4"}),
    ("torch.nn.functional.conv_transpose3d(x, w, cb, 2, 1, 1)",
     {"x": "1, 4, 3, 4, 3", "w": "4, 2, 3, 3, 3", "cb": "2"}),
    # Grouped, neither one group nor depthwise.
    ("torch.nn.functional.conv2d(x, w, cb, 1, 1, 1, 2)",
     {"x": "2, 4, 9, 7", "w": "6, 2, 3, 3", "cb": "6"}),
])
def test_every_convolution_is_the_librarys_and_its_epilogue_the_kernels(conv, shapes, tmp_path):
    path = write_problem(tmp_path / "problem.py", conv, ["torch.sigmoid(v) * v"], shapes,
                         torch.float32)
    source = check(path, Schedule(2, 32, 4))
    assert f"in{len(shapes)} = {conv.split('(')[0]}(in0, in1, None, " in source


def test_candidates_pass_the_evaluator(tmp_path):
    path = write_problem(
        tmp_path / "problem.py", "torch.nn.functional.conv2d(x, w, cb, 1, 1)",
        [BN, "torch.relu(v)"],
        {"x": "2, 3, 6, 7", "w": "4, 3, 3, 3", "cb": "4", "mean": "4", "var": "4", "g": "4",
         "b": "4"}, torch.float32)
    verdict = evaluate(path, write(path, Schedule(1, 64, 4)),
                       EvalConfig(device="cpu", time=False))
    assert verdict.correct, verdict.reason
    assert verdict.library_ops == ["aten.convolution"] and verdict.kernel_launches == 1


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_channel_rows_with_bias_batch_norm_and_residual_are_accepted(dtype, tmp_path):
    # Odd sizes: 5×7 maps, 6 channels; per-channel bias and batch norm, a full-shape residual.
    path = write_problem(
        tmp_path / "problem.py", "torch.nn.functional.conv2d(x, w, cb, 1, 1)",
        [BN, "v + r", "torch.nn.functional.gelu(v)"],
        {"x": "3, 4, 5, 7", "w": "6, 4, 3, 3", "cb": "6", "mean": "6", "var": "6", "g": "6",
         "b": "6", "r": "3, 6, 5, 7"}, dtype)
    source = write(path, Schedule(1, 32, 4))
    verdict = evaluate(path, source, EvalConfig(device="cpu", time=False))
    assert verdict.correct, f"{dtype}: {verdict.reason}\n{source}"


@pytest.mark.parametrize("draw,epilogue,extra", [
    # A channels-last input makes a channels-last conv output: no channel rows to walk.
    ("torch.randn(2, 3, 6, 5).to(memory_format=torch.channels_last)", ["torch.relu(v)"], {}),
    # An input broadcast over the spatial dims is neither per-channel nor full-shape.
    ("torch.randn(2, 3, 6, 5)", ["v * m", "torch.sigmoid(v)"], {"m": "6, 5"}),
    # A residual that is a transposed view.
    ("torch.randn(2, 3, 6, 5)", ["v + r"], {"r": "2, 4, 5, 6"}),
])
def test_other_layouts_take_the_general_split(draw, epilogue, extra, tmp_path):
    path = write_problem(tmp_path / "problem.py", "torch.nn.functional.conv2d(x, w, cb, 1, 1)",
                         epilogue, {"x": "2, 3, 6, 5", "w": "4, 3, 3, 3", "cb": "4", **extra},
                         torch.float32)
    text = path.read_text().replace("torch.randn(2, 3, 6, 5).to(torch.float32)", draw)
    path.write_text(text.replace("torch.randn(2, 4, 5, 6).to(torch.float32)",
                                 "torch.randn(2, 4, 5, 6).transpose(2, 3)"))
    inputs = import_problem(path).get_inputs()
    assert draw.endswith("channels_last)") != inputs[0].is_contiguous()
    check(path, Schedule(2, 16, 2))
    verdict = evaluate(path, write(path, Schedule(1, 64, 4)),
                       EvalConfig(device="cpu", time=False))
    assert verdict.correct, verdict.reason


def test_a_bare_conv_leaves_nothing_to_fuse(tmp_path):
    path = write_problem(tmp_path / "problem.py", "torch.nn.functional.conv2d(x, w)", ["v"],
                         {"x": "1, 2, 5, 5", "w": "3, 2, 3, 3"}, torch.float32)
    with pytest.raises(Unsupported, match="nothing for a kernel to do"):
        write(path, Schedule())


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_resnet_block_epilogue_is_accepted_on_gpu(dtype, tmp_path):
    path = write_problem(
        tmp_path / "problem.py", "torch.nn.functional.conv2d(x, w, None, 1, 1)",
        [BN, "v + r", "torch.relu(v)"],
        {"x": "8, 64, 56, 56", "w": "64, 64, 3, 3", "mean": "64", "var": "64", "g": "64",
         "b": "64", "r": "8, 64, 56, 56"}, dtype)
    verdict = evaluate(path, write(path, Schedule(1, 1024, 4)),
                       EvalConfig(device="cuda"))
    assert verdict.correct, verdict.reason
    assert verdict.library_ops == ["aten.convolution"]


@pytest.mark.parametrize("conv,epilogue,shapes,groups", [
    # A mean over a group norm's output (level 2's 23): the norm's statistics, then the mean.
    ("torch.nn.functional.conv3d(x, w, cb, 1, 1)",
     ["torch.nn.functional.group_norm(v, 2, g, b)", "v.mean(dim=[1, 2, 3, 4])"],
     {"x": "2, 3, 6, 7, 5", "w": "4, 3, 3, 3, 3", "cb": "4", "g": "4", "b": "4"}, 2),
    # A logsumexp over the channels of an activated norm plus the conv output (level 2's 92).
    ("torch.nn.functional.conv2d(x, w, cb)",
     ["v + torch.tanh(torch.nn.functional.group_norm(v, 3, g, b))",
      "torch.logsumexp(v, dim=1, keepdim=True)"],
     {"x": "2, 4, 9, 7", "w": "6, 4, 3, 3", "cb": "6", "g": "6", "b": "6"}, 3),
])
def test_a_reduction_over_a_norms_output_writes_its_statistics_not_the_output(
        conv, epilogue, shapes, groups, tmp_path):
    path = write_problem(tmp_path / "problem.py", conv, epilogue, shapes, torch.float32)
    source = check(path, Schedule(2, 32, 4))
    # Two kernels after the convolution; between them a mean and a variance a (sample, group).
    buffers = [re.search(r"torch\.empty\(\(([\d, ]+)\)", line).group(1)
               for line in source.splitlines() if "tmp" in line and "torch.empty(" in line]
    assert len(buffers) == 2, buffers
    assert all(math.prod(int(n) for n in b.split(",") if n.strip()) == 2 * groups
               for b in buffers), buffers
    verdict = evaluate(path, source, EvalConfig(device="cpu", time=False))
    assert verdict.correct, verdict.reason
    assert verdict.library_ops == ["aten.convolution"] and verdict.kernel_launches == 2


@pytest.mark.gpu
def test_a_mean_over_a_conv_norms_output_is_accepted_on_gpu(tmp_path):
    # Level 2's 23 at a quarter of its batch.
    path = norm_mean_problem(tmp_path / "problem.py", "32, 3, 24, 32, 32", 24, 8)
    for draft in RulesGenerator().propose(path, None, 6, ("triton", "cuda")).children:
        verdict = evaluate(path, draft.source, EvalConfig(device="cuda"))
        assert verdict.correct, f"{draft.settings}: {verdict.reason}"
        assert verdict.library_ops == ["aten.convolution"]
