"""Rules Triton for last-dimension reduction sites, with prologues and epilogues fused."""

from __future__ import annotations

import pytest
import torch

from generators.site_graph import Unsupported, load_site_graph
from generators.triton_reduction import RowConfig, write_row_reduction
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
