"""Rules Triton for sum, mean, amax and amin over a dimension other than the last."""

from __future__ import annotations

import pytest
import torch

from core.evaluate import EvalConfig, Evaluator, evaluate
from generators.base import Parent
from generators.rules import RulesGenerator, _dim_drafts
from generators.site_graph import Unsupported, load_site_graph
from generators.triton.dim_reduction import AUTO_SPLIT, DimConfig, write_dim_reduction
from tests.kernel_checks import assert_matches, one_input_problem
from tests.test_generator_pointwise import check

CASES = {
    "sum_dim1": ("x.sum(dim=1)", (3, 37, 5)),
    "mean_dim0_keepdim": ("torch.relu(x).mean(0, keepdim=True) * 2.0", (19, 6)),
    "amax_dim1_prologue": ("torch.amax(torch.abs(x) + 1.0, dim=1)", (2, 33, 4, 3)),
    "amin_dim2": ("torch.amin(x, dim=2)", (2, 3, 17, 5)),
}
DTYPES = [torch.float32, torch.float16, torch.bfloat16]


def problem(tmp_path, body: str, shape: tuple, dtype: torch.dtype):
    path = tmp_path / "problem.py"
    path.write_text(
        "import torch\nimport torch.nn as nn\n\n\nclass Model(nn.Module):\n"
        f"    def forward(self, x):\n        return {body}\n\n\n"
        f"def get_inputs():\n    return [torch.randn{shape}.to({dtype})]\n\n\n"
        "def get_init_inputs():\n    return []\n")
    return path


def run(path, config: DimConfig, x: torch.Tensor) -> None:
    """The candidate for `config` on `x`, against the problem's Model on the same input."""
    check(path, lambda graph: write_dim_reduction(graph, config), inputs=[x])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", list(CASES))
def test_reductions_over_inner_dimensions_match_pytorch(name, dtype, tmp_path):
    body, shape = CASES[name]
    check(problem(tmp_path, body, shape, dtype),
          lambda graph: write_dim_reduction(graph, DimConfig(block_r=8, block_i=4)))


# (body, input shape, split): the reduced extent is not a multiple of the split or of BLOCK_R
# (8), the outer extent is 1, the inner extent is odd.
SPLITS = {
    "sum, R=37 split 3": ("x.sum(dim=1)", (3, 37, 5), 3),
    "mean, N=1, R=29 split 4, I odd": ("x.mean(dim=0) * 3.0", (29, 7), 4),
    "amax, R=41 split 64 (more than R/BLOCK_R)": ("torch.amax(x * x, dim=1)", (2, 41, 3), 64),
    "amin keepdim, R=9 split 2": ("x.amin(dim=1, keepdim=True)", (1, 9, 13), 2),
    "sum, R=5 under one BLOCK_R, split 2": ("x.sum(dim=0)", (5, 3, 2), 2),
}


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", list(SPLITS))
def test_split_reductions_match_pytorch_on_odd_sizes(case, dtype, tmp_path):
    body, shape, split = SPLITS[case]
    path = problem(tmp_path, body, shape, dtype)
    run(path, DimConfig(block_r=8, block_i=4, split=split), torch.randn(shape).to(dtype))


def test_an_automatic_split_covers_every_reduced_row(tmp_path):
    # On the CPU one SM stands in, so an automatic split only happens when the grid has fewer
    # than programs_per_sm column tiles: here 1 tile, so 8 programs share its 61 rows.
    path = problem(tmp_path, "torch.amax(x, dim=0)", (61, 3), torch.float32)
    config = DimConfig(block_r=8, block_i=4, split=AUTO_SPLIT, programs_per_sm=8)
    x = torch.randn(61, 3)
    x[60, 1] = 50.0  # the maximum sits in the last, partial chunk
    run(path, config, x)
    source = write_dim_reduction(load_site_graph(path), config)
    assert "combine_kernel" in source and "multi_processor_count" in source


def test_split_results_are_the_same_on_every_run(tmp_path):
    path = problem(tmp_path, "x.sum(dim=0)", (203, 6), torch.float32)
    namespace: dict = {}
    exec(compile(write_dim_reduction(load_site_graph(path), DimConfig(block_r=8, block_i=8,
                                                                        split=5)),
                 "model_new.py", "exec"), namespace)
    x = torch.randn(203, 6) * 1e3
    model = namespace["ModelNew"]()
    first = model(x)
    assert all(torch.equal(first, model(x)) for _ in range(3))
    assert_matches(first, x.sum(dim=0))


def test_one_pass_source_has_no_combine_step(tmp_path):
    graph = load_site_graph(problem(tmp_path, "x.sum(dim=1)", (3, 37, 5), torch.float32))
    one_pass = write_dim_reduction(graph, DimConfig(split=1))
    assert "combine_kernel" not in one_pass and "partial" not in one_pass
    assert "combine_kernel" in write_dim_reduction(graph, DimConfig(split=4))


def test_other_shapes_than_the_captured(tmp_path):
    path = problem(tmp_path, "x.mean(dim=1)", (3, 37, 5), torch.float32)
    for config in (DimConfig(block_r=8, block_i=4), DimConfig(block_r=8, block_i=4, split=3)):
        run(path, config, torch.randn(1, 100, 9))
        run(path, config, torch.randn(4, 1, 3))


@pytest.mark.parametrize("dtype", DTYPES)
def test_drafts_are_accepted_by_the_evaluator(dtype, tmp_path):
    path = problem(tmp_path, "torch.relu(x).sum(dim=1) * 0.5", (2, 45, 7), dtype)
    drafts = _dim_drafts(load_site_graph(path))
    assert any(config.split == AUTO_SPLIT for config, _ in drafts)
    assert any(config.split == 1 for config, _ in drafts)
    for config, why in drafts:
        source = write_dim_reduction(load_site_graph(path), config)
        verdict = evaluate(path, source, EvalConfig(device="cpu", time=False))
        assert verdict.correct, f"{why} ({dtype}): {verdict.reason}"


def test_split_moves_along_its_ladder_and_the_automatic_split_by_programs_per_sm(tmp_path):
    path = problem(tmp_path, "x.amin(dim=0)", (40, 6), torch.float32)
    generator = RulesGenerator()
    drafts = {d.settings["split"]: d for d in generator.propose(path, None, n=3).children}
    assert set(drafts) == {AUTO_SPLIT, 1}, drafts
    automatic = generator.propose(path, Parent(drafts[AUTO_SPLIT]), n=10).children
    assert {c.settings["programs_per_sm"] for c in automatic} == {2, 4, 8}
    assert all(c.settings["split"] == AUTO_SPLIT for c in automatic)
    one_pass = generator.propose(path, Parent(drafts[1]), n=10).children
    assert {c.settings["split"] for c in one_pass} == {1, 2}
    split = next(c for c in one_pass if c.settings["split"] == 2)
    assert "split 1→2" in split.rationale
    verdict = evaluate(path, split.source, EvalConfig(device="cpu", time=False))
    assert verdict.correct, verdict.reason


def test_the_draft_rationale_names_the_split_for_the_shape(tmp_path):
    # amax over dim 0 of 8192²: 64 column tiles of 128 on 132 SMs, 9 programs share each.
    graph = load_site_graph(problem(tmp_path, "x.amax(dim=0)", (8192, 8192), torch.float32))
    reasons = [why for config, why in _dim_drafts(graph) if config.split == AUTO_SPLIT]
    assert reasons and "split 9 ways" in reasons[0], reasons


def test_last_dimension_is_left_to_the_row_kernel(tmp_path):
    path = problem(tmp_path, "x.sum(dim=-1)", (4, 8), torch.float32)
    with pytest.raises(Unsupported, match="row kernel"):
        write_dim_reduction(load_site_graph(path), DimConfig())


def test_a_negative_split_is_declined(tmp_path):
    path = problem(tmp_path, "x.sum(dim=0)", (4, 8), torch.float32)
    with pytest.raises(Unsupported, match="split -2"):
        write_dim_reduction(load_site_graph(path), DimConfig(split=-2))


GPU_SITES = {
    "sum over dim 1, 64×2048×512 fp32": ("x.sum(dim=1)", "torch.randn(64, 2048, 512)"),
    "amax over dim 0, 8192² fp32": ("x.amax(dim=0)", "torch.randn(8192, 8192)"),
    "mean over dim 0, 4096×1000 bf16": ("x.mean(dim=0)",
                                        "torch.randn(4096, 1000).bfloat16()"),
}


@pytest.mark.gpu
@pytest.mark.parametrize("site", list(GPU_SITES))
def test_split_reductions_are_accepted_on_the_gpu_at_realistic_sizes(site, tmp_path):
    body, inputs = GPU_SITES[site]
    path = one_input_problem(tmp_path, body, inputs)
    graph = load_site_graph(path)
    configs = [config for config, _ in _dim_drafts(graph)] + [DimConfig(split=16)]
    sources = [write_dim_reduction(graph, config) for config in configs]
    with Evaluator(EvalConfig(device="cuda"), workers=1) as evaluator:
        verdicts = evaluator.evaluate_many([(path, source) for source in sources])
    for source, verdict in zip(sources, verdicts, strict=True):
        assert verdict.correct, (source.splitlines()[0], verdict.reason)
