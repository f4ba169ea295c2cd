"""Rules Triton for softmax and log_softmax over a dimension other than the last."""

from __future__ import annotations

import pytest
import torch

from core.evaluate import EvalConfig, Evaluator, evaluate
from generators.base import Parent
from generators.rules import RulesGenerator, _dim_softmax_drafts
from generators.site_graph import Unsupported, load_site_graph
from generators.triton.dim_softmax import DimSoftmaxConfig, write_dim_softmax
from tests.kernel_checks import one_input_problem
from tests.test_generator_pointwise import check

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
# (forward parameters, body, input shape): dims 0, 1 and 2 of 3-D and 4-D inputs at odd sizes.
CASES = {
    "softmax dim 1 of NCHW": ("x", "torch.softmax(x, dim=1)", (2, 7, 5, 3)),
    "softmax dim 0 of 3-D, prologue": ("x", "torch.softmax(x * 1.5 + 0.25, dim=0)", (13, 3, 5)),
    "log_softmax dim 2 of 4-D": ("x", "torch.log_softmax(x, dim=2)", (2, 3, 9, 5)),
    "log_softmax dim -2 of 3-D, prologue": ("x", "torch.log_softmax(torch.tanh(x) * 4.0, -2)",
                                            (3, 11, 6)),
    "softmax dim 1, epilogue reads an input": ("x, g", "torch.softmax(x, dim=1) * g",
                                               (2, 6, 7)),
    "softmax dim 1, inner extent 1": ("x", "x.softmax(1)", (3, 19, 1)),
    "two outputs": ("x", "((s := torch.softmax(x, 0)), s * 2.0)", (9, 4)),
}
# Small tiles so the online loop runs several steps over a reduced extent that is not a
# multiple of BLOCK_R: a tile of 64 with 4 columns is 16 reduced rows per step.
LOOPED = DimSoftmaxConfig(block_i=4, tile=64, num_warps=2)
ONE_TILE = DimSoftmaxConfig(block_i=4, tile=1024, num_warps=2)


def problem(tmp_path, params: str, body: str, shape: tuple, dtype: torch.dtype):
    path = tmp_path / "problem.py"
    draws = ", ".join(f"torch.randn{shape}.to({dtype})" for _ in params.split(","))
    path.write_text(
        "import torch\nimport torch.nn as nn\n\n\nclass Model(nn.Module):\n"
        f"    def forward(self, {params}):\n        return {body}\n\n\n"
        f"def get_inputs():\n    return [{draws}]\n\n\n"
        "def get_init_inputs():\n    return []\n")
    return path


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", list(CASES))
def test_softmax_over_inner_dimensions_matches_pytorch(name, dtype, tmp_path):
    path = problem(tmp_path, *CASES[name], dtype)
    check(path, lambda graph: write_dim_softmax(graph, ONE_TILE))


# (forward parameters, body, input shape, where the largest logit is planted): 100 reduced
# rows walked 16 (or, with one inner column, 64) at a time, the largest in the last, partial step.
LOOP_CASES = {
    "softmax dim 0, prologue": ("x", "torch.softmax(x * 1.5 + 0.25, dim=0)", (100, 3, 5),
                                (99, 1, 2)),
    "log_softmax dim 1, prologue": ("x", "torch.log_softmax(torch.tanh(x) * 4.0, -2)",
                                    (3, 100, 6), (1, 99, 0)),
    "softmax dim 1, epilogue reads an input": ("x, g", "torch.softmax(x, dim=1) * g",
                                               (2, 100, 7), (0, 98, 6)),
    "softmax dim 1, inner extent 1": ("x", "x.softmax(1)", (3, 100, 1), (2, 99, 0)),
}


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", list(LOOP_CASES))
def test_the_online_loop_matches_pytorch(name, dtype, tmp_path):
    params, body, shape, peak = LOOP_CASES[name]
    path = problem(tmp_path, params, body, shape, dtype)
    inputs = [torch.randn(shape).to(dtype) for _ in params.split(",")]
    inputs[0][peak] = 6.0
    check(path, lambda graph: write_dim_softmax(graph, LOOPED), inputs=inputs)


def test_large_logits_do_not_overflow(tmp_path):
    path = problem(tmp_path, "x", "torch.softmax(x, dim=1)", (2, 40, 3), torch.float32)
    inputs = [torch.randn(2, 40, 3) * 200.0]
    for config in (ONE_TILE, LOOPED):
        check(path, lambda graph, config=config: write_dim_softmax(graph, config),
              inputs=inputs)


def test_other_shapes_than_the_captured(tmp_path):
    path = problem(tmp_path, "x", "torch.log_softmax(x, dim=1)", (2, 7, 5), torch.float32)
    for config in (ONE_TILE, LOOPED):
        for shape in ((1, 100, 3), (5, 1, 9), (3, 16, 64)):
            check(path, lambda graph, config=config: write_dim_softmax(graph, config),
                  inputs=[torch.randn(shape)])


@pytest.mark.parametrize("dtype", DTYPES)
def test_drafts_are_accepted_by_the_evaluator(dtype, tmp_path):
    path = problem(tmp_path, "x", "torch.softmax(torch.relu(x) - 1.0, dim=1)", (2, 21, 3, 5),
                   dtype)
    graph = load_site_graph(path)
    drafts = _dim_softmax_drafts(graph)
    assert drafts
    for config, why in drafts:
        verdict = evaluate(path, write_dim_softmax(graph, config),
                           EvalConfig(device="cpu", time=False))
        assert verdict.correct, f"{why} ({dtype}): {verdict.reason}"


def test_the_rules_generator_drafts_and_mutates_the_dimension_softmax(tmp_path):
    path = problem(tmp_path, "x", "torch.log_softmax(x, dim=1)", (2, 33, 3, 5), torch.float32)
    generator = RulesGenerator()
    drafts = generator.propose(path, None, n=3)
    assert drafts.children, drafts.declined
    # The dimension softmax drafts first; the kernel compiler's drafts follow.
    writers = [d.settings["writer"] for d in drafts.children]
    assert writers[0] == "write_dim_softmax", writers
    assert set(writers) <= {"write_dim_softmax", "write_compiled"}, writers
    children = generator.propose(path, Parent(drafts.children[0]), n=8).children
    assert len(children) >= 3, [c.rationale for c in children]
    for child in children:
        moved = [k for k, v in child.settings.items() if drafts.children[0].settings[k] != v]
        assert len(moved) == 1 and moved[0] in ("block_i", "tile", "num_warps"), child.settings
    for child in children[:2]:
        verdict = evaluate(path, child.source, EvalConfig(device="cpu", time=False))
        assert verdict.correct, (child.rationale, verdict.reason)


@pytest.mark.parametrize("params,body,reason", [
    ("x", "torch.softmax(x, dim=-1)", "row kernel"),
    ("x, b", "torch.softmax(x + b, dim=0)", "not a float tensor of the reduced"),
    ("x", "x.sum(dim=0)", "exactly one softmax"),
    ("x", "((h := x * 2.0), torch.softmax(h, 0))", "computed before the softmax"),
])
def test_what_it_cannot_do_is_declined_with_the_reason(params, body, reason, tmp_path):
    path = tmp_path / "problem.py"
    draws = "torch.randn(4, 8), torch.randn(8)" if "b" in params else "torch.randn(4, 8)"
    path.write_text(
        "import torch\nimport torch.nn as nn\n\n\nclass Model(nn.Module):\n"
        f"    def forward(self, {params}):\n        return {body}\n\n\n"
        f"def get_inputs():\n    return [{draws}]\n\n\ndef get_init_inputs():\n    return []\n")
    with pytest.raises(Unsupported, match=reason):
        write_dim_softmax(load_site_graph(path), DimSoftmaxConfig())


def test_tiles_must_be_powers_of_two(tmp_path):
    graph = load_site_graph(problem(tmp_path, "x", "torch.softmax(x, dim=0)", (4, 8),
                                    torch.float32))
    with pytest.raises(Unsupported, match="powers of two"):
        write_dim_softmax(graph, DimSoftmaxConfig(tile=3000))
    with pytest.raises(Unsupported, match="wider than a tile"):
        write_dim_softmax(graph, DimSoftmaxConfig(block_i=256, tile=128))


GPU_SITES = {
    "softmax over dim 1, 32×256×64² fp32": ("torch.softmax(x, dim=1)",
                                            "torch.randn(32, 256, 64, 64)"),
    "softmax over dim 1, 16×150×128² fp32": ("torch.softmax(x, dim=1)",
                                             "torch.randn(16, 150, 128, 128)"),
    "log_softmax over dim 0, 4096×2048 bf16 (online loop)": (
        "torch.log_softmax(x * 0.5, dim=0)", "torch.randn(4096, 2048).bfloat16()"),
}


@pytest.mark.gpu
@pytest.mark.parametrize("site", list(GPU_SITES))
def test_dim_softmax_is_accepted_on_the_gpu_at_realistic_sizes(site, tmp_path):
    body, inputs = GPU_SITES[site]
    path = one_input_problem(tmp_path, body, inputs)
    graph = load_site_graph(path)
    sources = [write_dim_softmax(graph, config) for config, _ in _dim_softmax_drafts(graph)]
    with Evaluator(EvalConfig(device="cuda"), workers=1) as evaluator:
        verdicts = evaluator.evaluate_many([(path, source) for source in sources])
    for source, verdict in zip(sources, verdicts, strict=True):
        assert verdict.correct, (source.splitlines()[0], verdict.reason)
