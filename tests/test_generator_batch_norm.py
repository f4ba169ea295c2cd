"""Rules Triton for batch norm with the batch's statistics: prologue, epilogue, odd shapes."""

from __future__ import annotations

import random

import pytest
import torch

from core.evaluate import EvalConfig, evaluate
from generators.rules import RulesGenerator
from generators.site_graph import Unsupported, load_site_graph
from generators.triton.batch_norm import BatchNormConfig, write_batch_norm
from tests.test_compiler_elementwise import check

BN = "torch.nn.functional.batch_norm"
# name: (forward's arguments, body, argument shapes)
CASES = {
    "relu_epilogue": ("x, w, b", f"torch.relu({BN}(x, None, None, w, b, True, 0.1, 1e-5))",
                      {"x": (3, 6, 5, 7), "w": (6,), "b": (6,)}),
    "residual_prologue_no_affine": ("x, r", f"{BN}(x * 0.5 + r, None, None, None, None, True)",
                                    {"x": (4, 5, 9), "r": (4, 5, 9)}),
    "features": ("x, w, b", f"torch.sigmoid({BN}(x, None, None, w, b, True, 0.0, 1e-3))",
                 {"x": (7, 11), "w": (11,), "b": (11,)}),
    "channel_scale_prologue": (
        "x, s, w, b", f"{BN}(x * s, None, None, w, b, training=True, eps=1e-5) + x",
        {"x": (2, 3, 4, 3), "s": (3, 1, 1), "w": (3,), "b": (3,)}),
}


def problem(tmp_path, name: str, dtype: torch.dtype, offset: float = 0.0):
    """The case as a site problem; `offset` shifts the input to test the statistics' accuracy."""
    args, body, shapes = CASES[name]
    draws = ", ".join(f"(torch.randn{shapes[a.strip()]} + {offset if a.strip() == 'x' else 0})"
                      f".to({dtype})" for a in args.split(","))
    path = tmp_path / f"{name}.py"
    path.write_text(
        "import torch\nimport torch.nn as nn\n\n\nclass Model(nn.Module):\n"
        f"    def forward(self, {args}):\n        return {body}\n\n\n"
        f"def get_inputs():\n    return [{draws}]\n\n\ndef get_init_inputs():\n    return []\n")
    return path


def small_tiles(block: int, programs_per_sm: int = 4):
    config = BatchNormConfig(block=block, programs_per_sm=programs_per_sm, num_warps=2)
    return lambda graph: write_batch_norm(graph, config)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("name", list(CASES))
def test_batch_norm_sites_match_pytorch(name, dtype, tmp_path):
    # 8-element tiles over several programs per channel: the partial statistics are merged.
    check(problem(tmp_path, name, dtype), small_tiles(8, programs_per_sm=8))


def test_one_program_per_channel(tmp_path):
    check(problem(tmp_path, "relu_epilogue", torch.float32), small_tiles(64, programs_per_sm=1))


def test_statistics_stay_accurate_far_from_zero(tmp_path):
    # A mean of 300 against a unit spread, as in the group-norm test: Welford states keep the
    # variance that E[x²] - E[x]² in fp32 would lose.
    path = problem(tmp_path, "relu_epilogue", torch.float32, offset=300.0)
    verdict = evaluate(path, small_tiles(16)(load_site_graph(path)), EvalConfig(device="cpu"))
    assert verdict.correct, verdict.reason


def test_strided_inputs_and_other_sizes(tmp_path):
    path = problem(tmp_path, "relu_epilogue", torch.float32)
    rng = random.Random(5)
    for _ in range(2):
        n, c, h, w = rng.randint(1, 4), rng.randint(1, 7), rng.randint(1, 5), rng.randint(2, 5)
        channels_last = torch.randn(n, h, w, c).permute(0, 3, 1, 2)
        check(path, small_tiles(16), inputs=[channels_last, torch.randn(c), torch.randn(c)])


def test_every_draft_is_accepted_by_the_evaluator(tmp_path):
    path = problem(tmp_path, "channel_scale_prologue", torch.float32)
    drafts = RulesGenerator().propose(path, None, n=4)
    mine = [d for d in drafts.children if d.settings["writer"] == "write_batch_norm"]
    assert mine, drafts.declined
    for draft in mine:
        verdict = evaluate(path, draft.source, EvalConfig(device="cpu"))
        assert verdict.correct, (draft.rationale, verdict.reason)


def test_inference_mode_is_left_to_the_pointwise_kernel(tmp_path):
    path = problem(tmp_path, "relu_epilogue", torch.float32)
    path.write_text(path.read_text().replace("None, None, w, b, True", "m, v, w, b, False")
                    .replace("def forward(self, x, w, b)", "def forward(self, x, w, b, m, v)")
                    .replace("torch.float32)]", "torch.float32), torch.zeros(6), torch.ones(6)]"))
    with pytest.raises(Unsupported, match="inference mode is elementwise"):
        write_batch_norm(load_site_graph(path), BatchNormConfig())


def test_running_statistics_stay_with_pytorch(tmp_path):
    path = problem(tmp_path, "relu_epilogue", torch.float32)
    path.write_text(path.read_text().replace("None, None, w, b, True", "m, v, w, b, True")
                    .replace("def forward(self, x, w, b)", "def forward(self, x, w, b, m, v)")
                    .replace("torch.float32)]", "torch.float32), torch.zeros(6), torch.ones(6)]"))
    declined = RulesGenerator().propose(path, None, n=2).declined
    assert "not one fusible site" in declined, declined


@pytest.mark.gpu
def test_batch_norm_drafts_are_accepted_on_the_gpu_at_realistic_sizes(tmp_path):
    # BatchNorm2d with batch statistics then ReLU: 64 images of 256 channels at 56², fp32.
    path = tmp_path / "problem.py"
    path.write_text(
        "import torch\nimport torch.nn as nn\n\n\nclass Model(nn.Module):\n"
        "    def forward(self, x, w, b):\n"
        f"        return torch.relu({BN}(x, None, None, w, b, True, 0.1, 1e-5))\n\n\n"
        "def get_inputs():\n    return [torch.randn(64, 256, 56, 56), torch.randn(256), "
        "torch.randn(256)]\n\n\ndef get_init_inputs():\n    return []\n")
    graph = load_site_graph(path)
    configs = [BatchNormConfig(), BatchNormConfig(block=2048, num_warps=8),
               BatchNormConfig(programs_per_sm=1)]
    for config in configs:
        verdict = evaluate(path, write_batch_norm(graph, config), EvalConfig(device="cuda"))
        assert verdict.correct, (config, verdict.reason)
