"""Compiled Triton for last-dimension reduction sites (softmax, norms, sums and extremes), with
prologues and epilogues fused, at odd sizes, in every float dtype, a block of rows a program or
programs striding over the blocks."""

from __future__ import annotations

import pytest
import torch

from core.evaluate import EvalConfig, Evaluator, evaluate
from generators.compiler.schedule import Schedule
from generators.rules import RulesGenerator
from generators.site_graph import load_site_graph
from generators.triton.program import write_compiled
from tests.test_compiler_elementwise import check

BODIES = {
    "softmax": ("torch.softmax(x, dim=-1)", "x"),
    "log_softmax_prologue": ("torch.log_softmax(x * 2.0 + b, dim=-1)", "x, b"),
    "layer_norm_residual": (
        "h = x + r\n        return h, torch.nn.functional.layer_norm(h, (37,), w, b, 1e-5)",
        "x, r, w, b"),
    "layer_norm_gelu": (
        "torch.nn.functional.gelu(torch.nn.functional.layer_norm(x, (37,), w, b))", "x, w, b"),
    "rms_norm": ("torch.nn.functional.rms_norm(x, (37,), w, 1e-6)", "x, w"),
    "sum": ("x.sum(dim=-1)", "x"),
    "mean_keepdim": ("torch.relu(x).mean(-1, keepdim=True) * 3.0", "x"),
    "amax": ("torch.amax(x, dim=-1)", "x"),
}
SHAPES = {"x": "(3, 5, 37)", "r": "(3, 5, 37)", "b": "(37,)", "w": "(37,)",
          "m": "(11, 37)"}


def write_problem(path, body: str, args: str, dtype: torch.dtype) -> None:
    statement = body if body.lstrip().startswith("h =") else f"return {body}"
    draws = ", ".join(f"torch.randn({SHAPES[a.strip()]}).to({dtype})" for a in args.split(","))
    path.write_text(
        "import torch\nimport torch.nn as nn\n\n\nclass Model(nn.Module):\n"
        f"    def forward(self, {args}):\n        {statement}\n\n\n"
        f"def get_inputs():\n    return [{draws}]\n\n\ndef get_init_inputs():\n    return []\n")


def rows(graph):
    return write_compiled(graph, Schedule(1, 64, 2))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("name", list(BODIES))
def test_row_reductions_match_pytorch(name, dtype, tmp_path):
    path = tmp_path / "problem.py"
    write_problem(path, *BODIES[name], dtype)
    check(path, rows)


# 15 rows of 37 in the problems above: no block size divides them, so the last block of rows
# is partly masked; programs striding over the blocks walk several each; 16 columns a step walk
# each row in a loop.
TILED = {
    "four_rows": Schedule(4, 64, 2),
    "sixteen_rows": Schedule(16, 64, 4),
    "strided_one_row": Schedule(1, 64, 2, resident_per_sm=2),
    "strided_eight_rows": Schedule(8, 64, 4, resident_per_sm=1),
    "looped": Schedule(2, 16, 2),
}


@pytest.mark.parametrize("config", list(TILED))
@pytest.mark.parametrize("name", list(BODIES))
def test_rows_per_program_and_striding_programs_match_pytorch(name, config, tmp_path):
    path = tmp_path / "problem.py"
    write_problem(path, *BODIES[name], torch.float32)
    check(path, lambda graph: write_compiled(graph, TILED[config]))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("name", ["softmax", "layer_norm_residual", "rms_norm", "mean_keepdim"])
def test_striding_blocks_of_rows_in_half_precision(name, dtype, tmp_path):
    path = tmp_path / "problem.py"
    write_problem(path, *BODIES[name], dtype)
    check(path, lambda graph: write_compiled(graph, TILED["strided_eight_rows"]))


def test_weights_that_are_not_one_dimensional_are_read_per_row(tmp_path):
    path = tmp_path / "problem.py"
    write_problem(path, "torch.softmax(x * m, dim=-1)", "x, m", torch.float32)
    path.write_text(path.read_text().replace("(3, 5, 37)", "(3, 11, 37)"))  # m is (11, 37)
    check(path, lambda graph: write_compiled(graph, TILED["four_rows"]))


@pytest.mark.parametrize(("length", "strided"), [(37, False), (2000, True)])
def test_drafts_take_blocks_of_short_rows_and_stride_over_long_ones(length, strided, tmp_path):
    path = tmp_path / "problem.py"
    write_problem(path, *BODIES["layer_norm_gelu"], torch.float32)
    path.write_text(path.read_text().replace("37", str(length)).replace("(3, 5,", "(3,"))
    drafts = RulesGenerator().propose(path, None, n=4).children
    assert {d.settings["writer"] for d in drafts} == {"write_compiled"}, drafts
    assert drafts[0].settings["block_rows"] > 1 and drafts[1].settings["block_rows"] == 1
    assert any(d.settings["resident_per_sm"] for d in drafts) is strided, \
        [d.rationale for d in drafts]
    for draft in drafts:
        verdict = evaluate(path, draft.source, EvalConfig(device="cpu"))
        assert verdict.correct, (draft.rationale, verdict.reason)


GPU_SITES = {
    "softmax 4096x8192 fp32": ("torch.softmax(x, dim=-1)", "x", "torch.randn(4096, 8192)"),
    "rms_norm 8192x4096 bf16": ("torch.nn.functional.rms_norm(x, (4096,), w, 1e-6)", "x, w",
                                "torch.randn(8192, 4096).bfloat16(), "
                                "torch.randn(4096).bfloat16()"),
    "layer_norm 32768x512 fp16": ("torch.nn.functional.layer_norm(x, (512,), w, b)", "x, w, b",
                                  "torch.randn(32768, 512).half(), torch.randn(512).half(), "
                                  "torch.randn(512).half()"),
}
# Two rows of 8192 fill the 16384-element tile limit.
GPU_CONFIGS = [Schedule(2, 8192, 8), Schedule(1, 8192, 8, resident_per_sm=4),
               Schedule(2, 8192, 8, resident_per_sm=2)]


@pytest.mark.gpu
@pytest.mark.parametrize("site", list(GPU_SITES))
def test_blocks_of_rows_are_accepted_on_the_gpu_at_realistic_sizes(site, tmp_path):
    body, args, inputs = GPU_SITES[site]
    path = tmp_path / "problem.py"
    path.write_text(
        "import torch\nimport torch.nn as nn\n\n\nclass Model(nn.Module):\n"
        f"    def forward(self, {args}):\n        return {body}\n\n\n"
        f"def get_inputs():\n    return [{inputs}]\n\n\ndef get_init_inputs():\n    return []\n")
    graph = load_site_graph(path)
    with Evaluator(EvalConfig(device="cuda"), workers=1) as evaluator:
        sources = [write_compiled(graph, config) for config in GPU_CONFIGS]
        verdicts = evaluator.evaluate_many([(path, source) for source in sources])
    for source, verdict in zip(sources, verdicts, strict=True):
        assert verdict.correct, (source.splitlines()[0], verdict.reason)
