"""Rules Triton for sum, mean, amax and amin over a dimension other than the last."""

from __future__ import annotations

import pytest
import torch

from generators.site_graph import Unsupported, load_site_graph
from generators.triton_dim_reduction import DimConfig, write_dim_reduction
from tests.test_generator_pointwise import check

CASES = {
    "sum_dim1": ("x.sum(dim=1)", (3, 37, 5)),
    "mean_dim0_keepdim": ("torch.relu(x).mean(0, keepdim=True) * 2.0", (19, 6)),
    "amax_dim1_prologue": ("torch.amax(torch.abs(x) + 1.0, dim=1)", (2, 33, 4, 3)),
    "amin_dim2": ("torch.amin(x, dim=2)", (2, 3, 17, 5)),
}


def problem(tmp_path, body: str, shape: tuple, dtype: torch.dtype):
    path = tmp_path / "problem.py"
    path.write_text(
        "import torch\nimport torch.nn as nn\n\n\nclass Model(nn.Module):\n"
        f"    def forward(self, x):\n        return {body}\n\n\n"
        f"def get_inputs():\n    return [torch.randn{shape}.to({dtype})]\n\n\n"
        "def get_init_inputs():\n    return []\n")
    return path


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("name", list(CASES))
def test_reductions_over_inner_dimensions_match_pytorch(name, dtype, tmp_path):
    body, shape = CASES[name]
    check(problem(tmp_path, body, shape, dtype),
          lambda graph: write_dim_reduction(graph, DimConfig(block_r=8, block_i=4)))


def test_last_dimension_is_left_to_the_row_kernel(tmp_path):
    path = problem(tmp_path, "x.sum(dim=-1)", (4, 8), torch.float32)
    with pytest.raises(Unsupported, match="row kernel"):
        write_dim_reduction(load_site_graph(path), DimConfig())
