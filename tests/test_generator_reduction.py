"""Rules Triton for last-dimension reduction sites, with prologues and epilogues fused."""

from __future__ import annotations

import pytest
import torch

from core.evaluate import EvalConfig, Evaluator, evaluate
from generators.rules import RulesGenerator
from generators.site_graph import Unsupported, load_site_graph
from generators.triton.row_reduction import RowConfig, write_row_reduction
from tests.test_generator_pointwise import check

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
    return write_row_reduction(graph, RowConfig(num_warps=2))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("name", list(BODIES))
def test_row_reductions_match_pytorch(name, dtype, tmp_path):
    path = tmp_path / "problem.py"
    write_problem(path, *BODIES[name], dtype)
    check(path, rows)


def test_strided_rows_and_other_shapes(tmp_path):
    path = tmp_path / "problem.py"
    write_problem(path, *BODIES["layer_norm_residual"], torch.float32)
    x = torch.randn(37, 2, 3).permute(1, 2, 0)  # rows not contiguous
    check(path, rows, inputs=[x, torch.randn(2, 3, 37), torch.randn(37), torch.randn(37)])


def test_reduction_over_another_dimension_is_declined_with_the_reason(tmp_path):
    path = tmp_path / "problem.py"
    write_problem(path, "torch.softmax(x, dim=0)", "x", torch.float32)
    with pytest.raises(Unsupported, match="over dimension 0"):
        rows(load_site_graph(path))


# 15 rows of 37 in the problems above: no block size divides them, so the last block of rows
# is partly masked; one persistent program per (interpreter) SM walks several blocks.
TILED = {
    "four_rows": RowConfig(num_warps=2, rows=4),
    "sixteen_rows": RowConfig(num_warps=4, rows=16),
    "persistent_one_row": RowConfig(num_warps=2, persistent=True, programs_per_sm=2),
    "persistent_eight_rows": RowConfig(num_warps=4, rows=8, persistent=True, programs_per_sm=1,
                                       num_stages=3),
}


@pytest.mark.parametrize("config", list(TILED))
@pytest.mark.parametrize("name", list(BODIES))
def test_rows_per_program_and_persistent_match_pytorch(name, config, tmp_path):
    path = tmp_path / "problem.py"
    write_problem(path, *BODIES[name], torch.float32)
    check(path, lambda graph: write_row_reduction(graph, TILED[config]))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("name", ["softmax", "layer_norm_residual", "rms_norm", "mean_keepdim"])
def test_persistent_blocks_of_rows_in_half_precision(name, dtype, tmp_path):
    path = tmp_path / "problem.py"
    write_problem(path, *BODIES[name], dtype)
    check(path, lambda graph: write_row_reduction(graph, TILED["persistent_eight_rows"]))


def test_blocks_of_rows_on_strided_and_odd_row_counts(tmp_path):
    path = tmp_path / "problem.py"
    write_problem(path, *BODIES["layer_norm_residual"], torch.float32)
    config = RowConfig(rows=8, persistent=True, programs_per_sm=1)
    x = torch.randn(37, 7, 3).permute(1, 2, 0)  # 21 rows, not contiguous
    check(path, lambda graph: write_row_reduction(graph, config),
          inputs=[x, torch.randn(7, 3, 37), torch.randn(37), torch.randn(37)])
    check(path, lambda graph: write_row_reduction(graph, config),
          inputs=[torch.randn(1, 1, 37), torch.randn(1, 1, 37), torch.randn(37), torch.randn(37)])


def test_weights_that_are_not_one_dimensional_are_read_per_row(tmp_path):
    path = tmp_path / "problem.py"
    write_problem(path, "torch.softmax(x * m, dim=-1)", "x, m", torch.float32)
    path.write_text(path.read_text().replace("(3, 5, 37)", "(3, 11, 37)"))  # m is (11, 37)
    check(path, lambda graph: write_row_reduction(graph, TILED["four_rows"]))


def test_a_tile_too_large_for_registers_is_declined(tmp_path):
    path = tmp_path / "problem.py"
    write_problem(path, "torch.softmax(x, dim=-1)", "x", torch.float32)
    path.write_text(path.read_text().replace("(3, 5, 37)", "(4, 2000)"))
    with pytest.raises(Unsupported, match="spills registers"):
        write_row_reduction(load_site_graph(path), RowConfig(rows=16))


def test_rows_longer_than_registers_hold_are_left_to_the_compilers_loops(tmp_path):
    path = tmp_path / "problem.py"
    write_problem(path, "torch.softmax(x, dim=-1)", "x", torch.float32)
    path.write_text(path.read_text().replace("(3, 5, 37)", "(2, 40000)"))
    with pytest.raises(Unsupported, match="longer than the 32768"):
        write_row_reduction(load_site_graph(path), RowConfig())
    writers = {d.settings["writer"] for d in RulesGenerator().propose(path, None, n=4).children}
    assert writers and "write_row_reduction" not in writers, writers


@pytest.mark.parametrize(("length", "expected"), [(37, {"rows": 16}), (2000, {"persistent": True})])
def test_drafts_add_rows_for_short_rows_and_persistence_for_long(length, expected, tmp_path):
    path = tmp_path / "problem.py"
    write_problem(path, *BODIES["layer_norm_gelu"], torch.float32)
    path.write_text(path.read_text().replace("37", str(length)).replace("(3, 5,", "(3,"))
    drafts = [d for d in RulesGenerator().propose(path, None, n=4).children
              if d.settings["writer"] == "write_row_reduction"]
    assert len(drafts) == 2, [d.rationale for d in drafts]
    assert all(drafts[1].settings[knob] == value for knob, value in expected.items())
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
GPU_CONFIGS = [RowConfig(num_warps=8, rows=2), RowConfig(num_warps=8, persistent=True),
               RowConfig(num_warps=8, rows=2, persistent=True, programs_per_sm=2, num_stages=3)]


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
        sources = [write_row_reduction(graph, config) for config in GPU_CONFIGS]
        verdicts = evaluator.evaluate_many([(path, source) for source in sources])
    for source, verdict in zip(sources, verdicts, strict=True):
        assert verdict.correct, (source.splitlines()[0], verdict.reason)
