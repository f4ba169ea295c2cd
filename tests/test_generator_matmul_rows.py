"""Matmul sites reducing their output's rows: tiles reduce columns, a row kernel combines."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch

from bench.sm90_compile_bench import compile_for_sm90
from generators.site_graph import Unsupported, load_site_graph
from generators.triton.matmul import MatmulConfig, write_triton_matmul
from tests.kernel_checks import assert_matches, first_draft, judged, run_beside_problem

SMALL = MatmulConfig(block_m=16, block_n=16, block_k=16, group_m=2, num_warps=4, num_stages=2)
KINDS = ["sum", "mean", "amax", "amin", "logsumexp"]
ANCHORS = {
    "linear": ("torch.nn.functional.linear(x, w, bias)", "torch.randn({m}, {k})",
               "torch.randn({n}, {k})"),
    "mm": ("torch.mm(x, w)", "torch.randn({m}, {k})", "torch.randn({k}, {n})"),
    "bmm": ("torch.bmm(x, w)", "torch.randn(2, {m}, {k})", "torch.randn(2, {k}, {n})"),
}


def write(path: Path, body: list[str], returns: str, anchor: str, sizes: dict[str, int],
          dtype: torch.dtype, extra: str = "") -> Path:
    expression, x, w = ANCHORS[anchor]
    draws = [x.format(**sizes), w.format(**sizes), f"torch.randn({sizes['n']})"]
    if extra:
        draws.append(extra)
    lines = "\n".join(f"        {line}" for line in [f"v = {expression}", *body])
    path.write_text(
        "import torch\nimport torch.nn as nn\n\n\nclass Model(nn.Module):\n"
        "    def forward(self, x, w, bias" + (", s" if extra else "") + "):\n"
        f"{lines}\n        return {returns}\n\n\n"
        f"def get_inputs():\n    return [{', '.join(f'{d}.to({dtype})' for d in draws)}]\n\n\n"
        "def get_init_inputs():\n    return []\n")
    return path


def run(path: Path, config: MatmulConfig = SMALL) -> tuple[str, tuple, tuple]:
    graph = load_site_graph(path)
    source = write_triton_matmul(graph, config)
    actual, expected = run_beside_problem(source, path, 5)
    return source, _as_tuple(actual), _as_tuple(expected)


def _as_tuple(value: object) -> tuple:
    return value if isinstance(value, tuple) else (value,)


def check(path: Path, config: MatmulConfig = SMALL) -> str:
    source, actual, expected = run(path, config)
    assert len(actual) == len(expected)
    for got, want in zip(actual, expected, strict=True):
        if want.dtype.is_floating_point:
            assert_matches(got, want, path.read_text())
        else:
            assert torch.equal(got, want), (got, want)
    return source


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("anchor", sorted(ANCHORS))
def test_each_reduction_of_each_anchor_matches_pytorch(kind, anchor, tmp_path):
    rng = random.Random(f"{kind}-{anchor}")
    sizes = {"m": rng.choice([17, 33]), "n": rng.choice([23, 40, 57]), "k": rng.choice([5, 19])}
    keepdim = rng.random() < 0.5
    body = ["v = torch.relu(v) - 0.25" if anchor != "linear" else "v = v / 2",
            f"r = torch.{kind}(v, dim=-1, keepdim={keepdim})", "r = torch.tanh(r) * 1.5"]
    source = check(write(tmp_path / "problem.py", body, "r", anchor, sizes, torch.float32))
    assert "def row_kernel(" in source and "tl.store(out0_ptr" not in source, (
        "the matmul's output is never written when only its rows leave the site")


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_rows_and_the_tile_both_returned(dtype, tmp_path):
    body = ["v = torch.nn.functional.gelu(v)", "r = torch.logsumexp(v, dim=1, keepdim=True)",
            "r = r * s"]
    path = write(tmp_path / "problem.py", body, "r, v", "linear", {"m": 19, "n": 45, "k": 24},
                 dtype, extra="torch.randn(19, 1)")
    source = check(path)
    assert "tl.store(out0_ptr" in source and "tl.store(row_out0_ptr" in source


def test_tail_views_and_reductions_over_single_values_like_kernelbench_18(tmp_path):
    # Sum of a row, then max, mean and logsumexp over that one value: each the value itself.
    body = ["r = torch.sum(v, dim=1, keepdim=True)", "r, at = torch.max(r, dim=1, keepdim=True)",
            "r = torch.mean(r, dim=1, keepdim=True)", "r = torch.logsumexp(r, dim=1)",
            "r = r.view(-1, 1) + 1.0"]
    source = check(write(tmp_path / "problem.py", body, "r, at", "linear",
                         {"m": 21, "n": 37, "k": 11}, torch.float32))
    assert source.count("def row_kernel(") == 1


@pytest.mark.parametrize("kind", KINDS)
def test_rows_longer_than_one_step_of_partials(kind, tmp_path):
    # 70 column tiles of 16: the row kernel walks the partials 64 at a time.
    body = [f"r = torch.{kind}(v, dim=-1)"]
    path = write(tmp_path / "problem.py", body, "r", "mm", {"m": 3, "n": 1117, "k": 2},
                 torch.float32)
    check(path)


def test_every_row_kernel_compiles_for_sm90_over_several_steps(tmp_path):
    """Triton's compiler, not its interpreter, on each kind's row kernel walking 128 partials
    64 at a time (a step's folded value carried across the loop failed to compile on sm_90:
    bench/NOTES.md, 2026-12-05, 11:50-12:10 UTC)."""
    signature = {"part_ptr": "*fp32", "row_out0_ptr": "*fp32", "ROWS": "i32",
                 "COLUMNS": "i32", "TILES": "constexpr", "BLOCK_R": "constexpr",
                 "BLOCK_T": "constexpr"}
    results = {}
    for kind in KINDS:
        folder = tmp_path / kind
        folder.mkdir()
        path = write(folder / "problem.py", [f"r = torch.{kind}(v, dim=-1)"], "r", "linear",
                     {"m": 32, "n": 64, "k": 16}, torch.float32)
        module = folder / "model_new.py"
        module.write_text(write_triton_matmul(load_site_graph(path), SMALL))
        results |= compile_for_sm90(module, [
            {"name": kind, "kernel": "row_kernel", "signature": signature,
             "constexprs": {"TILES": 128, "BLOCK_R": 32, "BLOCK_T": 64},
             "aligned": [0, 1, 2, 3]}])
    failed = {kind: r["error"][-400:] for kind, r in results.items() if "error" in r}
    assert not failed, failed


def test_infinite_rows_reduce_as_pytorch_does(tmp_path):
    body = ["v = v * 0.0 - float('inf')", "r = torch.logsumexp(v, dim=1)"]
    path = write(tmp_path / "problem.py", body, "r", "mm", {"m": 5, "n": 20, "k": 3},
                 torch.float32)
    _, actual, expected = run(path)
    assert torch.equal(actual[0], expected[0]), (actual, expected)


def test_reductions_the_tiles_cannot_take_stay_out_of_the_site(tmp_path):
    across = write(tmp_path / "problem.py", ["r = torch.sum(v, dim=1, keepdim=True)",
                                             "r = torch.sum(r, dim=0)"], "r", "mm",
                   {"m": 5, "n": 7, "k": 3}, torch.float32)
    softmax = write(tmp_path / "softmax.py", ["r = torch.softmax(v, dim=1)"], "r", "mm",
                    {"m": 5, "n": 300, "k": 3}, torch.float32)
    # A sum across the rows, and a softmax of rows wider than a tile holds (the tiles would
    # write them before knowing their sums), are left out of the matmul's site: a problem
    # holding them is two sites.
    for path in (across, softmax):
        with pytest.raises(Unsupported, match=r"2 regions \(matmul, reduction\)"):
            load_site_graph(path)


def test_drafts_pass_the_evaluator_and_size_tiles_by_the_matmul(tmp_path):
    body = ["v = v / 2", "r = torch.sum(v, dim=1, keepdim=True)", "r = r * 1.5"]
    path = write(tmp_path / "problem.py", body, "r", "linear", {"m": 17, "n": 23, "k": 19},
                 torch.float32)
    draft = first_draft(path, n=4)
    assert draft.settings["precision"] == "tf32x3"
    judged(path, draft.source, launches=2)


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["sum", "logsumexp"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_realistic_gemm_with_its_rows_reduced_is_accepted_on_gpu(kind, dtype, tmp_path):
    body = ["v = v * 2.0", f"r = torch.{kind}(v, dim=1, keepdim=True)", "r = r * 0.5"]
    path = write(tmp_path / "problem.py", body, "r", "linear",
                 {"m": 1024, "n": 4096, "k": 2048}, dtype)
    precision = "tf32x3" if dtype == torch.float32 else "ieee"
    config = MatmulConfig(num_warps=8, precision=precision)
    judged(path, write_triton_matmul(load_site_graph(path), config), "cuda", launches=2)
