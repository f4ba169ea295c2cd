"""Kiln's own convolution in a compiled conv site (`Schedule.library_layout == "gemm"`): an
implicit GEMM in Triton in place of cuDNN's call, the site's kernels after it unchanged."""

from __future__ import annotations

import pytest
import torch

from core.evaluate import EvalConfig, evaluate
from generators.compiler.schedule import Schedule
from generators.compiler.site import program_of
from generators.cuda.program import write_cuda_compiled
from generators.mutations import neighbours
from generators.site_graph import Unsupported, load_site_graph
from generators.triton.program import compiled_drafts, write_compiled
from tests.kernel_checks import assert_matches, run_beside_problem
from tests.test_generator_conv import norm_mean_problem, write_problem

GEMM = Schedule(2, 32, 4, library_layout="gemm")
CONVS = {
    # Padded, with a bias: the window's edges read as zeros.
    "conv2d padded": ("torch.nn.functional.conv2d(x, w, cb, 1, 1)",
                      {"x": "2, 3, 7, 9", "w": "5, 3, 3, 3", "cb": "5"}),
    # Strided and dilated volumes; 17 output channels (two tiles of channels).
    "conv3d dilated": ("torch.nn.functional.conv3d(x, w, cb, 1, 1, 2)",
                       {"x": "2, 3, 6, 7, 5", "w": "17, 3, 3, 3, 3", "cb": "17"}),
    "conv3d strided": ("torch.nn.functional.conv3d(x, w, None, 2)",
                       {"x": "1, 2, 7, 6, 9", "w": "4, 2, 3, 2, 3"}),
    # A window of 144 (channels in x kernel): fp32 as one TF32 product, not three.
    "conv2d long window": ("torch.nn.functional.conv2d(x, w, cb, 1, 1)",
                           {"x": "1, 16, 5, 6", "w": "5, 16, 3, 3", "cb": "5"}),
    # A sequence, strided and padded; a window of 25 (channels in x kernel) past one dot step.
    "conv1d": ("torch.nn.functional.conv1d(x, w, cb, 2, 2)",
               {"x": "2, 5, 13", "w": "4, 5, 5", "cb": "4"}),
}


def problem(tmp_path, name: str, epilogue: list[str], dtype: torch.dtype = torch.float32):
    conv, shapes = CONVS[name]
    return write_problem(tmp_path / "problem.py", conv, epilogue, shapes, dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("name", list(CONVS))
def test_the_implicit_gemm_matches_cudnns_convolution(name, dtype, tmp_path):
    path = problem(tmp_path, name, ["torch.nn.functional.silu(v)"], dtype)
    source = write_compiled(load_site_graph(path), GEMM)
    actual, expected = run_beside_problem(source, path, 5)
    assert_matches(actual, expected, source)
    assert "torch.nn.functional.conv" not in source and "_convolve(in0, in1, " in source


def test_a_site_with_its_own_convolution_calls_no_library(tmp_path):
    # Level 2's 23 in small: the norm's statistics and the mean after Kiln's convolution.
    path = norm_mean_problem(tmp_path / "problem.py", "2, 3, 6, 7, 5", 6, 2)
    verdict = evaluate(path, write_compiled(load_site_graph(path), GEMM),
                       EvalConfig(device="cpu", time=False))
    assert verdict.correct, verdict.reason
    assert verdict.library_ops == [] and verdict.kernel_launches == 3


def test_a_channels_last_input_is_gathered_as_it_lies(tmp_path):
    path = problem(tmp_path, "conv2d padded", ["torch.relu(v)"])
    text = path.read_text().replace("torch.randn(2, 3, 7, 9).to(torch.float32)",
                                    "torch.randn(2, 3, 7, 9).to(memory_format=torch.channels_last)")
    assert "channels_last" in text
    path.write_text(text)
    source = write_compiled(load_site_graph(path), GEMM)
    actual, expected = run_beside_problem(source, path, 2)
    assert_matches(actual, expected, source)


@pytest.mark.parametrize("conv,weight,why", [
    ("torch.nn.functional.conv2d(x, w, None, 1, 1, 1, 2)", "6, 2, 3, 3", "grouped"),
    ("torch.nn.functional.conv_transpose2d(x, w)", "4, 6, 3, 3", "transposed"),
])
def test_grouped_and_transposed_convolutions_stay_cudnns(conv, weight, why, tmp_path):
    path = write_problem(tmp_path / "problem.py", conv, ["torch.relu(v)"],
                         {"x": "2, 4, 6, 6", "w": weight}, torch.float32)
    graph = load_site_graph(path)
    with pytest.raises(Unsupported, match="transposed or grouped"):
        program_of(graph, "gemm")
    assert all(s.library_layout != "gemm" for s, _ in compiled_drafts(graph))


def test_no_draft_is_kilns_but_a_search_moves_there_from_a_channels_last_one(tmp_path):
    graph = load_site_graph(problem(tmp_path, "conv2d padded", ["torch.relu(v)"]))
    drafts = compiled_drafts(graph)
    assert [s.library_layout for s, _ in drafts[:2]] == ["", "channels_last"]
    assert all(s.library_layout != "gemm" for s, _ in drafts)
    moves = {step.settings.library_layout: step.rationale
             for step in neighbours(drafts[1][0]) if step.knob == "library_layout"}
    assert set(moves) == {"", "gemm"}
    assert "implicit GEMM" in moves["gemm"] and "as given" in moves[""]


def test_the_cuda_tier_keeps_cudnn(tmp_path):
    graph = load_site_graph(problem(tmp_path, "conv2d padded", ["torch.relu(v)"]))
    with pytest.raises(Unsupported, match="Triton kernel"):
        write_cuda_compiled(graph, GEMM)


@pytest.mark.gpu
@pytest.mark.parametrize("conv,shapes", [
    # Level 2's 23 and 92 convolutions, at a quarter of their batches.
    ("torch.nn.functional.conv3d(x, w, cb)",
     {"x": "32, 3, 24, 32, 32", "w": "24, 3, 3, 3, 3", "cb": "24"}),
    ("torch.nn.functional.conv2d(x, w, cb)",
     {"x": "32, 8, 128, 128", "w": "64, 8, 3, 3", "cb": "64"}),
])
def test_the_implicit_gemm_is_accepted_on_gpu(conv, shapes, tmp_path):
    path = write_problem(tmp_path / "problem.py", conv, ["torch.relu(v)"], shapes,
                         torch.float32)
    verdict = evaluate(path, write_compiled(load_site_graph(path), Schedule(4, 256, 4,
                                                                           library_layout="gemm")),
                       EvalConfig(device="cuda"))
    assert verdict.correct, verdict.reason
    assert verdict.library_ops == []
