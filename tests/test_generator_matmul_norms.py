"""Matmul sites whose tiles finish a normalization of the product: softmax, log-softmax, layer,
RMS and group norm over the output's columns, normalized in registers and stored once."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from core.runtime.tile_norms import (
    MAX_TILE_SEGMENT,
    RowNormArguments,
    TileNorm,
    row_norm_arguments,
    tile_norm,
)
from generators.site_graph import Unsupported, load_site_graph
from generators.triton.matmul import MatmulConfig, fit_segments, write_triton_matmul
from tests.kernel_checks import assert_matches, first_draft, judged, run_beside_problem

SMALL = MatmulConfig(block_m=16, block_n=16, block_k=16, group_m=2, num_warps=4, num_stages=2)
F = "torch.nn.functional"


def problem(path: Path, body: list[str], m: int, n: int, k: int,
            dtype: torch.dtype = torch.float32) -> Path:
    """`x @ w.T + bias`, then `body` on `v`; g and b are per-column weights, drawn away from 1
    and 0 so that a missing affine shows."""
    lines = "\n".join(f"        {line}" for line in [f"v = {F}.linear(x, w, bias)", *body])
    draws = [f"torch.randn({m}, {k})", f"torch.randn({n}, {k})", f"torch.randn({n})",
             f"1.5 + torch.rand({n})", f"torch.randn({n})"]
    path.write_text(
        "import torch\nimport torch.nn as nn\n\n\nclass Model(nn.Module):\n"
        "    def forward(self, x, w, bias, g, b):\n"
        f"{lines}\n        return v\n\n\n"
        f"def get_inputs():\n    return [{', '.join(f'{d}.to({dtype})' for d in draws)}]\n\n\n"
        "def get_init_inputs():\n    return []\n")
    return path


def check(path: Path, config: MatmulConfig = SMALL) -> str:
    source = write_triton_matmul(load_site_graph(path), config)
    actual, expected = run_beside_problem(source, path, 3)
    pairs = zip(actual, expected, strict=True) if isinstance(actual, tuple) else [(actual,
                                                                                   expected)]
    for got, want in pairs:
        assert_matches(got, want, path.read_text())
    return source


NORMS = {
    "softmax": "v = torch.softmax(v, dim=-1)",
    "log_softmax": f"v = {F}.log_softmax(v, dim=1)",
    "layer_norm": f"v = {F}.layer_norm(v, (N,), g, b, 1e-5)",
    "rms_norm": f"v = {F}.rms_norm(v, [N], g)",
    "group_norm": f"v = {F}.group_norm(v, N // 8, g, b)",
}


@pytest.mark.parametrize("n", [32, 24], ids=["a power of two", "a row padded"])
@pytest.mark.parametrize("norm", sorted(NORMS))
def test_each_norm_finished_in_the_tile_matches_pytorch(norm, n, tmp_path):
    if norm == "group_norm" and n == 24:
        n = 48  # groups of 8 side by side, the last tile half empty
    body = ["v = v * 0.5", NORMS[norm].replace("N", str(n)), "v = torch.tanh(v) + 1.0"]
    source = check(problem(tmp_path / "problem.py", body, m=19, n=n, k=13))
    assert "tl.reshape(" in source and source.count("tl.store(") == 1, (
        "one kernel stores the normalized product once")


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_group_norm_then_a_row_reduction(dtype, tmp_path):
    body = [f"v = {F}.group_norm(v, 4, g, b)", f"v = {F}.silu(v)",
            "r = torch.logsumexp(v, dim=-1)"]
    path = problem(tmp_path / "problem.py", body, m=21, n=64, k=16, dtype=dtype)
    path.write_text(path.read_text().replace("return v\n", "return v, r\n"))
    source = check(path)
    assert "def row_kernel(" in source


def test_a_segment_wider_than_the_draft_tile_widens_the_tile(tmp_path):
    path = problem(tmp_path / "problem.py", [f"v = {F}.layer_norm(v, (64,), g, b)"],
                   m=9, n=64, k=8)
    source = check(path)  # SMALL's tiles are 16 columns wide
    assert "BLOCK_N=64" in source


def test_a_tile_widened_to_256_columns_gets_8_warps():
    wide = fit_segments(MatmulConfig(block_m=128, block_n=64, num_warps=4),
                        [TileNorm("group_norm", 256, 256)])
    assert (wide.block_m, wide.block_n, wide.num_warps) == (128, 256, 8)
    padded = fit_segments(MatmulConfig(block_m=128, block_n=256, num_warps=4),
                          [TileNorm("layer_norm", 96, 128)])
    assert (padded.block_m, padded.block_n, padded.num_warps) == (128, 128, 4)


def test_rows_that_are_all_minus_infinity_softmax_to_nan(tmp_path):
    path = problem(tmp_path / "problem.py", ["v = v * 0.0 - float('inf')",
                                             "v = torch.softmax(v, dim=-1)"], m=5, n=12, k=3)
    source = write_triton_matmul(load_site_graph(path), SMALL)
    actual, expected = run_beside_problem(source, path, 0)
    assert actual.isnan().all() and expected.isnan().all()


def test_what_the_tiles_cannot_finish_is_another_site(tmp_path):
    wide = problem(tmp_path / "wide.py", ["v = torch.softmax(v, dim=-1)"], m=4,
                   n=MAX_TILE_SEGMENT + 8, k=3)
    odd_groups = problem(tmp_path / "groups.py", [f"v = {F}.group_norm(v, 4, g, b)"], m=4,
                         n=24, k=3)  # groups of 6 cannot lie side by side in a tile
    for path in (wide, odd_groups):
        with pytest.raises(Unsupported, match=r"2 regions \(matmul, reduction\)"):
            load_site_graph(path)


def test_the_rules_decide_the_segments():
    shape = (8, 96)
    assert tile_norm("softmax", shape, ["x", -1], {}, torch.float32).block == 128
    assert tile_norm("softmax", shape, ["x", 0], {}, torch.float32) is None
    assert tile_norm("softmax", shape, ["x", -1], {"dtype": torch.float64},
                     torch.float32) is None
    assert tile_norm("group_norm", shape, ["x", 6], {}, torch.float32).segment == 16
    assert tile_norm("group_norm", (8, 96, 4), ["x", 6], {}, torch.float32) is None
    assert tile_norm("layer_norm", shape, ["x", (8, 96)], {}, torch.float32) is None
    rms = tile_norm("rms_norm", shape, ["x", [96]], {}, torch.bfloat16)
    assert rms.eps == torch.finfo(torch.bfloat16).eps
    # As the matmul's prologue reads a norm too: an int shape, keywords over positions.
    assert row_norm_arguments("layer_norm", ["x", 96, "w", "b", 0.5], {"eps": 1e-3},
                              torch.float32) == RowNormArguments((96,), "w", "b", 1e-3)


def test_drafts_pass_the_evaluator(tmp_path):
    path = problem(tmp_path / "problem.py", [f"v = {F}.group_norm(v, 8, g, b)",
                                             "v = v * torch.sigmoid(v)"], m=17, n=64, k=19)
    judged(path, first_draft(path).source, launches=1)


@pytest.mark.gpu
@pytest.mark.parametrize("norm", ["group_norm", "softmax"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_realistic_gemm_finishing_its_norm_is_accepted_on_gpu(norm, dtype, tmp_path):
    # 62's shape, smaller: groups of 16 columns; a softmax over rows of 256.
    n = 4096 if norm == "group_norm" else MAX_TILE_SEGMENT
    body = [NORMS[norm].replace("N // 8", "N // 16").replace("N", str(n)),
            f"v = {F}.leaky_relu(v, 0.01)"]
    path = problem(tmp_path / "problem.py", body, m=1024, n=n, k=2048, dtype=dtype)
    precision = "tf32x3" if dtype == torch.float32 else "ieee"
    config = MatmulConfig(num_warps=8, precision=precision)
    judged(path, write_triton_matmul(load_site_graph(path), config), "cuda", launches=1)
