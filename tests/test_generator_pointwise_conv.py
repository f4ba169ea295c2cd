"""A convolution by a 1×1 kernel written as the matmul it is (`matmul_anchor.pointwise_conv`):
each sample's channels × positions times the weight's [out, in] matrix, the bias, batch norm,
residual and activation applied on the tiles, so that no output is written twice and cuDNN is
not called."""

from __future__ import annotations

import pytest
import torch

from core.evaluate import EvalConfig, evaluate
from generators.rules import RulesGenerator
from generators.site_graph import Unsupported, load_site_graph
from generators.triton.matmul import MatmulConfig, write_triton_matmul
from tests.kernel_checks import assert_matches, run_beside_problem
from tests.test_generator_conv import BN, write_problem

SMALL = MatmulConfig(block_m=16, block_n=16, block_k=16, num_warps=4)


def check(path, config: MatmulConfig = SMALL) -> str:
    source = write_triton_matmul(load_site_graph(path), config)
    actual, expected = run_beside_problem(source, path, 3)
    assert_matches(actual, expected, source)
    return source


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_a_resnet_bottleneck_projection_is_one_matmul_kernel(dtype, tmp_path):
    # 7 input channels (not a multiple of the tile's 16), 5×7 positions, 6 output channels.
    path = write_problem(
        tmp_path / "problem.py", "torch.nn.functional.conv2d(x, w)", [BN, "v + r", "torch.relu(v)"],
        {"x": "2, 7, 5, 7", "w": "6, 7, 1, 1", "mean": "6", "var": "6", "g": "6", "b": "6",
         "r": "2, 6, 5, 7"}, dtype)
    source = check(path)
    assert "conv2d" not in source.split("class ModelNew")[1]
    verdict = evaluate(path, source, EvalConfig(device="cpu", time=False))
    assert verdict.correct, verdict.reason
    assert verdict.library_ops == [] and verdict.kernel_launches == 1


def test_the_bias_is_added_along_the_channels_and_a_channels_last_input_read_in_place(
        tmp_path):
    # Six output channels and six columns: a bias broadcast along the last dimension would
    # still run, and be wrong.
    path = write_problem(tmp_path / "problem.py", "torch.nn.functional.conv2d(x, w, cb)",
                         ["torch.sigmoid(v) * v"],
                         {"x": "3, 5, 4, 6", "w": "6, 5, 1, 1", "cb": "6"}, torch.float32)
    source = check(path)
    text = path.read_text().replace("torch.randn(3, 5, 4, 6).to(torch.float32)",
                                    "torch.randn(3, 5, 4, 6).to(memory_format=torch.channels_last)")
    assert "channels_last" in text
    path.write_text(text)
    check(path)
    verdict = evaluate(path, source, EvalConfig(device="cpu", time=False))
    assert verdict.correct, verdict.reason


@pytest.mark.parametrize("conv,shapes", [
    ("torch.nn.functional.conv1d(x, w, cb)", {"x": "2, 5, 9", "w": "4, 5, 1", "cb": "4"}),
    ("torch.nn.functional.conv3d(x, w, cb, 1, 0, 1, 1)",
     {"x": "2, 3, 4, 5, 3", "w": "5, 3, 1, 1, 1", "cb": "5"}),
])
def test_volumes_and_sequences_by_a_1x1_kernel_are_matmuls_too(conv, shapes, tmp_path):
    check(write_problem(tmp_path / "problem.py", conv, ["torch.tanh(v)"], shapes, torch.float32))


@pytest.mark.parametrize("conv,weight", [
    ("torch.nn.functional.conv2d(x, w, None, 2)", "6, 4, 1, 1"),  # strided
    ("torch.nn.functional.conv2d(x, w, None, 1, 1)", "6, 4, 1, 1"),  # padded
    ("torch.nn.functional.conv2d(x, w, None, 1, 0, 1, 2)", "6, 2, 1, 1"),  # grouped
    ("torch.nn.functional.conv2d(x, w)", "6, 4, 3, 3"),  # a 3×3 kernel
])
def test_other_convolutions_get_no_matmul_draft(conv, weight, tmp_path):
    path = write_problem(tmp_path / "problem.py", conv, ["torch.relu(v)"],
                         {"x": "2, 4, 6, 6", "w": weight}, torch.float32)
    with pytest.raises(Unsupported, match="1×1 kernel"):
        write_triton_matmul(load_site_graph(path), SMALL)
    drafts = RulesGenerator().propose(path, None, 8).children
    assert drafts and all(d.settings["writer"] == "write_compiled" for d in drafts)


def test_the_rules_draft_fp32_in_tf32_as_cudnn_convolves_it(tmp_path):
    path = write_problem(tmp_path / "problem.py", "torch.nn.functional.conv2d(x, w)",
                         ["torch.relu(v)"], {"x": "2, 4, 6, 6", "w": "8, 4, 1, 1"},
                         torch.float32)
    drafts = RulesGenerator().propose(path, None, 8).children
    matmuls = [d for d in drafts if d.settings["writer"] == "write_triton_matmul"]
    # TF32 first; then fp32's accuracy, for a norm after it that magnifies TF32's rounding.
    assert [d.settings["precision"] for d in matmuls] == ["tf32", "tf32", "tf32x3"]
    assert 'input_precision="tf32"' in matmuls[0].source
    verdict = evaluate(path, matmuls[0].source, EvalConfig(device="cpu", time=False))
    assert verdict.correct, verdict.reason


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_a_resnet_bottleneck_projection_is_accepted_on_gpu(dtype, tmp_path):
    path = write_problem(
        tmp_path / "problem.py", "torch.nn.functional.conv2d(x, w)", [BN, "v + r", "torch.relu(v)"],
        {"x": "32, 64, 56, 56", "w": "256, 64, 1, 1", "mean": "256", "var": "256", "g": "256",
         "b": "256", "r": "32, 256, 56, 56"}, dtype)
    drafts = RulesGenerator().propose(path, None, 8).children
    for draft in (d for d in drafts if d.settings["writer"] == "write_triton_matmul"):
        verdict = evaluate(path, draft.source, EvalConfig(device="cuda"))
        assert verdict.correct, f"{draft.settings}: {verdict.reason}"
        assert verdict.library_ops == [] and verdict.kernel_launches == 1
