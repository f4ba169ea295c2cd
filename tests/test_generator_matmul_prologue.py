"""Matmul sites with a prologue: the elementwise ops computing the left operand, on its tiles."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from core.evaluate import EvalConfig, evaluate
from generators.rules import RulesGenerator
from generators.site_graph import Unsupported, load_site_graph
from generators.triton.matmul import MatmulConfig, write_triton_matmul
from tests.kernel_checks import assert_matches, run_beside_problem

SMALL = MatmulConfig(block_m=16, block_n=16, block_k=16, group_m=2, num_warps=4, num_stages=2)


def write(path: Path, body: str, inputs: list[str], dtype: torch.dtype = torch.float32) -> Path:
    names = [f"in{i}" for i in range(len(inputs))]
    draws = ", ".join(f"{shape}.to({dtype})" for shape in inputs)
    path.write_text(
        "import torch\nimport torch.nn as nn\nimport torch.nn.functional as F\n\n\n"
        f"class Model(nn.Module):\n    def forward(self, {', '.join(names)}):\n"
        f"        return {body}\n\n\n"
        f"def get_inputs():\n    return [{draws}]\n\n\n"
        "def get_init_inputs():\n    return []\n")
    return path


def check(path: Path, config: MatmulConfig = SMALL) -> str:
    graph = load_site_graph(path)
    assert graph.ops[0].kind.value != "matmul", "the prologue is part of the matmul's site"
    source = write_triton_matmul(graph, config)
    actual, expected = run_beside_problem(source, path, 2)
    assert_matches(actual, expected, path.read_text())
    return source


@pytest.mark.parametrize(("body", "inputs"), [
    # A row-broadcast scale and shift, then GELU, into a linear with a bias.
    ("F.linear(F.gelu(in0 * in1 + 1.0), in2, in3)",
     ["torch.randn(37)", "torch.randn(2, 19, 37)", "torch.randn(45, 37)", "torch.randn(45)"]),
    # log() maps the zeros past K to -inf: they must not reach the product.
    ("torch.mm(torch.log(in0.abs() + 0.5), in1)", ["torch.randn(21, 35)", "torch.randn(35, 9)"]),
    # A residual of the operand's shape, then ReLU, into addmm with a scaled product.
    ("torch.addmm(in2, torch.relu(in0 + in1), in3, alpha=0.5)",
     ["torch.randn(17, 33)", "torch.randn(17, 33)", "torch.randn(23)", "torch.randn(33, 23)"]),
    # A column of per-row scales, broadcast along K, into a batched product.
    ("torch.bmm(torch.sigmoid(in0) * in1, in2)",
     ["torch.randn(3, 11, 20)", "torch.randn(3, 11, 1)", "torch.randn(3, 20, 13)"]),
])
def test_prologues_on_each_anchor_match_pytorch(body, inputs, tmp_path):
    source = check(write(tmp_path / "problem.py", body, inputs))
    assert "def row_kernel" not in source and "a_in = a.to(tl.float32)" in source


@pytest.mark.parametrize(("body", "inputs"), [
    # A layer norm with its affine, then GELU, into a linear: rows of 37 values, shifted.
    ("F.linear(F.gelu(F.layer_norm(in0, (37,), in1, in2)), in3, in4)",
     ["(torch.randn(2, 19, 37) * 3 + 1)", "torch.randn(37)", "torch.randn(37)",
      "torch.randn(45, 37)", "torch.randn(45)"]),
    # Without the affine, into mm.
    ("torch.mm(F.layer_norm(in0, (70,)), in1)", ["torch.randn(21, 70)", "torch.randn(70, 9)"]),
    # RMS norm with a weight and its own eps.
    ("F.linear(F.rms_norm(in0, (40,), in1, eps=1e-3), in2)",
     ["torch.randn(3, 7, 40)", "torch.randn(40)", "torch.randn(33, 40)"]),
])
def test_a_norm_of_the_operands_rows_is_applied_to_its_tiles(body, inputs, tmp_path):
    source = check(write(tmp_path / "problem.py", body, inputs))
    assert "def row_stats_kernel(" in source and "row_rstd" in source


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_norm_prologue(dtype, tmp_path):
    path = write(tmp_path / "problem.py", "F.linear(F.layer_norm(in0, (48,), in1), in2)",
                 ["torch.randn(4, 9, 48)", "torch.randn(48)", "torch.randn(24, 48)"], dtype)
    check(path)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_prologue_and_epilogue(dtype, tmp_path):
    path = write(tmp_path / "problem.py", "torch.tanh(F.linear(F.silu(in0), in1, in2))",
                 ["torch.randn(4, 9, 40)", "torch.randn(24, 40)", "torch.randn(24)"], dtype)
    check(path)


def test_a_prologue_with_a_row_reduction_after_the_product(tmp_path):
    path = write(tmp_path / "problem.py",
                 "torch.logsumexp(torch.mm(torch.relu(in0) * 2.0, in1), dim=1, keepdim=True)",
                 ["torch.randn(19, 26)", "torch.randn(26, 40)"])
    source = check(path)
    assert "def row_kernel(" in source


def test_the_drafts_pass_the_evaluator(tmp_path):
    path = write(tmp_path / "problem.py", "F.linear(torch.relu(in0 - 0.5), in1, in2)",
                 ["torch.randn(17, 19)", "torch.randn(23, 19)", "torch.randn(23)"])
    drafts = RulesGenerator().propose(path, None, n=4).children
    assert drafts, "the rules generator drafts a site with a prologue"
    verdict = evaluate(path, drafts[0].source, EvalConfig(device="cpu", time=False))
    assert verdict.correct, verdict.reason
    assert verdict.kernel_launches == 1 and verdict.library_ops == []


def test_a_prologue_on_a_batch_broadcasting_matmul_says_why(tmp_path):
    path = write(tmp_path / "problem.py", "torch.matmul(torch.relu(in0), in1)",
                 ["torch.randn(1, 5, 7)", "torch.randn(3, 7, 4)"])
    with pytest.raises(Unsupported, match="broadcasts its batch"):
        write_triton_matmul(load_site_graph(path), SMALL)
