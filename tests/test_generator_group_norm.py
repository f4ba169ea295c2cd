"""Rules Triton for group_norm and instance_norm sites: prologue and epilogue fused, odd shapes,
three dtypes."""

from __future__ import annotations

import random

import pytest
import torch

from core.evaluate import EvalConfig, evaluate
from generators.rules import RulesGenerator
from generators.site_graph import Unsupported, load_site_graph
from generators.triton.group_norm import GroupNormConfig, write_group_norm
from tests.kernel_checks import one_input_problem
from tests.test_compiler_elementwise import check

F = "torch.nn.functional"
# name: (forward's arguments, body, argument shapes, groups)
CASES = {
    "silu_epilogue": ("x, w, b", f"{F}.silu({F}.group_norm(x * 2.0, {{g}}, w, b, 1e-5))",
                      {"x": (3, 6, 5, 7), "w": (6,), "b": (6,)}, 3),
    "residual_prologue": ("x, r, w, b", f"{F}.group_norm(x + r, {{g}}, w, b, 1e-6)",
                          {"x": (2, 12, 9), "r": (2, 12, 9), "w": (12,), "b": (12,)}, 4),
    "channel_bias_no_affine": ("x, c", f"torch.relu({F}.group_norm(x + c, {{g}}))",
                               {"x": (2, 10, 3, 3), "c": (10, 1, 1)}, 5),
    "two_dimensional": ("x, w, b", f"{F}.group_norm(x, {{g}}, w, b) * 0.5",
                        {"x": (5, 8), "w": (8,), "b": (8,)}, 2),
    "one_group_per_channel": ("x, w, b", f"torch.sigmoid({F}.group_norm(x, {{g}}, w, b))",
                              {"x": (2, 3, 17), "w": (3,), "b": (3,)}, 3),
    # Instance norm is group norm with a group a channel (no group count: 0 below), as
    # nn.InstanceNorm2d's capture spells it, and with an affine map by keyword.
    "instance_norm_as_captured": (
        "x", f"{F}.instance_norm(x, None, None, None, None, True, 0.1, 1e-05) / 2.0",
        {"x": (3, 4, 5, 7)}, 0),
    "instance_norm_affine": ("x, w, b", f"torch.tanh({F}.instance_norm(x + 1.0, weight=w, "
                                        "bias=b, eps=1e-4))",
                             {"x": (2, 5, 33), "w": (5,), "b": (5,)}, 0),
}


def problem(tmp_path, name: str, dtype: torch.dtype, offset: float = 0.0):
    """The case as a site problem; `offset` shifts the input to test the statistics' accuracy."""
    args, body, shapes, groups = CASES[name]
    draws = ", ".join(f"(torch.randn{shapes[a.strip()]} + {offset if a.strip() == 'x' else 0})"
                      f".to({dtype})" for a in args.split(","))
    path = tmp_path / f"{name}.py"
    path.write_text(
        "import torch\nimport torch.nn as nn\n\n\nclass Model(nn.Module):\n"
        f"    def forward(self, {args}):\n        return {body.format(g=groups)}\n\n\n"
        f"def get_inputs():\n    return [{draws}]\n\n\ndef get_init_inputs():\n    return []\n")
    return path


def small_tiles(block: int):
    return lambda graph: write_group_norm(graph, GroupNormConfig(block=block, num_warps=2))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("name", list(CASES))
def test_group_norm_sites_match_pytorch(name, dtype, tmp_path):
    # 16 elements per tile: groups span several tiles in both channels and positions.
    check(problem(tmp_path, name, dtype), small_tiles(16))


def test_statistics_stay_accurate_far_from_zero(tmp_path):
    # A mean of 300 against a spread of 1.4: E[x²] - E[x]² in fp32 puts the variance of such
    # groups 0.5-1.3% off (measured), where the evaluator allows 1e-4.
    path = problem(tmp_path, "residual_prologue", torch.float32, offset=300.0)
    source = small_tiles(64)(load_site_graph(path))
    verdict = evaluate(path, source, EvalConfig(device="cpu"))
    assert verdict.correct, verdict.reason


def test_strided_inputs_and_other_sizes(tmp_path):
    path = problem(tmp_path, "silu_epilogue", torch.float32)
    rng = random.Random(3)
    for _ in range(2):
        n, c, h, w = rng.randint(1, 3), 3 * rng.randint(1, 4), rng.randint(1, 6), rng.randint(1, 6)
        channels_last = torch.randn(n, h, w, c).permute(0, 3, 1, 2)
        check(path, small_tiles(32), inputs=[channels_last, torch.randn(c), torch.randn(c)])


@pytest.mark.parametrize("programs", [1, 3])
def test_a_persistent_grid_takes_every_group_in_turn(programs, tmp_path):
    # On the CPU one SM stands in: 1 program walks all 8 (sample, group)s; 3 programs leave
    # the last a step with no group, which must store nothing.
    path = problem(tmp_path, "residual_prologue", torch.float32)
    config = GroupNormConfig(block=16, num_warps=2, persistent=True, programs_per_sm=programs)
    check(path, lambda graph: write_group_norm(graph, config))


def test_every_draft_is_accepted_by_the_evaluator(tmp_path):
    path = problem(tmp_path, "residual_prologue", torch.float32)
    drafts = RulesGenerator().propose(path, None, n=4)
    mine = [d for d in drafts.children if d.settings["writer"] == "write_group_norm"]
    assert mine, drafts.declined
    for draft in mine:
        verdict = evaluate(path, draft.source, EvalConfig(device="cpu"))
        assert verdict.correct, (draft.rationale, verdict.reason)


def test_sites_it_cannot_handle_say_why(tmp_path):
    path = tmp_path / "problem.py"
    path.write_text(
        "import torch\nimport torch.nn as nn\n\n\nclass Model(nn.Module):\n"
        "    def forward(self, x, v):\n"
        "        return torch.nn.functional.group_norm(x * v, 2)\n\n\n"
        "def get_inputs():\n    return [torch.randn(2, 4, 5), torch.randn(5)]\n\n\n"
        "def get_init_inputs():\n    return []\n")
    with pytest.raises(Unsupported, match=r"broadcasts to \(2, 4, 5\) other than per channel"):
        write_group_norm(load_site_graph(path), GroupNormConfig())


def test_instance_norm_from_running_statistics_is_left_to_the_pointwise_kernel(tmp_path):
    path = one_input_problem(tmp_path, f"{F}.instance_norm(x, m, v, use_input_stats=False)",
                             "torch.randn(2, 3, 5), torch.randn(3), torch.rand(3)", "x, m, v")
    with pytest.raises(Unsupported, match="instance_norm from running statistics is elementwise"):
        write_group_norm(load_site_graph(path), GroupNormConfig())


@pytest.mark.gpu
def test_group_norm_drafts_are_accepted_on_the_gpu_at_realistic_sizes(tmp_path):
    # A diffusion U-Net block's GroupNorm → SiLU: 8 × 320 channels at 128², 32 groups, bf16.
    path = tmp_path / "problem.py"
    path.write_text(
        "import torch\nimport torch.nn as nn\n\n\nclass Model(nn.Module):\n"
        "    def forward(self, x, w, b):\n"
        "        return torch.nn.functional.silu(torch.nn.functional.group_norm(x, 32, w, b))\n"
        "\n\ndef get_inputs():\n    return [torch.randn(8, 320, 128, 128).bfloat16(), "
        "torch.randn(320).bfloat16(), torch.randn(320).bfloat16()]\n\n\n"
        "def get_init_inputs():\n    return []\n")
    graph = load_site_graph(path)
    configs = [GroupNormConfig(), GroupNormConfig(block=4096, num_warps=8),
               GroupNormConfig(block=4096, num_warps=16, persistent=True)]
    for config in configs:
        verdict = evaluate(path, write_group_norm(graph, config), EvalConfig(device="cuda"))
        assert verdict.correct, (config, verdict.reason)
