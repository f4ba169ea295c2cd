"""The rules generator's interface: drafts, one-knob children, duplicates skipped, reasons."""

from __future__ import annotations

import torch

from core.evaluate import EvalConfig, evaluate
from generators.base import Parent
from generators.rules import RulesGenerator
from tests.test_generator_reduction import write_problem


def test_drafts_then_children_that_each_move_one_knob(tmp_path):
    problem = tmp_path / "problem.py"
    write_problem(problem, "torch.sigmoid(x) * x + 1.0", "x", torch.float32)
    generator = RulesGenerator()
    drafts = generator.propose(problem, None, n=4)
    assert drafts.children and not drafts.declined
    draft = drafts.children[0]
    assert draft.tier == "triton" and draft.generator == "rules" and draft.rationale
    children = generator.propose(problem, Parent(draft), n=10).children
    assert children, "no children"
    sources = {draft.source, *(c.source for c in children)}
    assert len(sources) == len(children) + 1, "a child repeats a source"
    for child in children:
        moved = {k for k, v in child.settings.items() if draft.settings.get(k) != v}
        assert len(moved) == 1, child.settings
        assert "→" in child.rationale
    again = generator.propose(problem, Parent(draft), n=10)
    assert again.children == [] and "duplicate" in again.declined


def test_every_child_is_accepted_by_the_evaluator(tmp_path):
    problem = tmp_path / "problem.py"
    write_problem(problem, "torch.nn.functional.layer_norm(x, (37,), w, b) * 2.0", "x, w, b",
                  torch.float32)
    generator = RulesGenerator()
    draft = generator.propose(problem, None, n=1).children[0]
    children = generator.propose(problem, Parent(draft), n=2).children
    config = EvalConfig(device="cpu")
    for proposal in [draft, *children]:
        verdict = evaluate(problem, proposal.source, config)
        assert verdict.correct, (proposal.rationale, verdict.reason)


def test_a_site_without_rules_is_declined_with_a_plain_reason(tmp_path):
    problem = tmp_path / "problem.py"
    write_problem(problem, "torch.atan(x) + b", "x, b", torch.float32)
    result = RulesGenerator().propose(problem, None, n=3)
    # Each writer says why, the compiler naming the op that stopped it.
    assert result.children == [] and "atan (aten.atan) has no lowering" in result.declined
    attention = tmp_path / "attention.py"
    write_problem(attention, "torch.nn.functional.scaled_dot_product_attention(x, r, x)",
                  "x, r", torch.float32)
    declined = RulesGenerator().propose(attention, None, 1, tiers=("cuda",)).declined
    assert "no cuda rules for attention" in declined


def test_each_family_and_tier_has_drafts(tmp_path):
    cases = {
        ("pointwise", "cuda"): ("torch.relu(x) + b", "x, b"),
        ("reduction", "cuda"): ("torch.softmax(x, dim=-1)", "x"),
        ("matmul", "triton"): ("torch.relu(torch.nn.functional.linear(x, m))", "x, m"),
    }
    generator = RulesGenerator()
    for (family, tier), (body, args) in cases.items():
        problem = tmp_path / f"{family}_{tier}.py"
        write_problem(problem, body, args, torch.float16)
        drafts = generator.propose(problem, None, n=3, tiers=(tier,))
        assert drafts.children, (family, tier, drafts.declined)
        assert all(d.tier == tier for d in drafts.children)
        children = generator.propose(problem, Parent(drafts.children[0]), n=2, tiers=(tier,))
        assert children.children, (family, tier, children.declined)


def test_reduction_over_an_inner_dimension_gets_compiled_rows_side_by_side(tmp_path):
    problem = tmp_path / "problem.py"
    write_problem(problem, "x.sum(dim=1)", "x", torch.float32)
    drafts = RulesGenerator().propose(problem, None, n=2)
    assert drafts.children, drafts.declined
    assert all(d.settings["writer"] == "write_compiled" for d in drafts.children)
    assert "side by side" in drafts.children[0].rationale, drafts.children[0].rationale
    verdict = evaluate(problem, drafts.children[0].source, EvalConfig(device="cpu"))
    assert verdict.correct, verdict.reason
