"""Comparing a generated kernel's output with PyTorch's, with a message that shows where; running
a candidate source beside its problem's Model; judging a draft through the evaluator; the
one-line site problems the kernel tests write."""

from __future__ import annotations

from pathlib import Path

import torch

from core.evaluate import EvalConfig, Verdict, evaluate
from generators.base import Proposal
from generators.rules import RulesGenerator

# Relative to the reference's largest magnitude. bf16 keeps 8 bits of mantissa, and a chain
# rounded once in fp32 differs from PyTorch's per-op rounding by up to a couple of its ulps.
TOLERANCE = {torch.float32: 1e-5, torch.float16: 1e-2, torch.bfloat16: 2e-2}


def assert_matches(actual: torch.Tensor, expected: torch.Tensor, context: str = "") -> None:
    assert actual.dtype == expected.dtype and actual.shape == expected.shape, (
        f"got {actual.dtype} {tuple(actual.shape)}, expected {expected.dtype} "
        f"{tuple(expected.shape)}")
    scale = expected.double().abs().max().item() + 1e-6
    error = (actual.double() - expected.double()).abs()
    worst = error.max().item() / scale
    where = tuple(int(i) for i in torch.nonzero(error == error.max())[0])
    assert worst <= TOLERANCE[expected.dtype], (
        f"relative error {worst:.3g} at {where}: {actual[where].item()} vs "
        f"{expected[where].item()}\n{context}")


def run_beside_problem(source: str, problem_path: Path, seed: int,
                       inputs: list | None = None) -> tuple[object, object]:
    """The candidate `source`'s ModelNew and the problem's Model on the same inputs (the
    problem's, drawn after `seed`, unless given): (actual, expected)."""
    from tests.test_site_problems import import_problem

    namespace: dict = {}
    exec(compile(source, "model_new.py", "exec"), namespace)
    problem = import_problem(problem_path)
    torch.manual_seed(seed)
    inputs = inputs or problem.get_inputs()
    with torch.no_grad():
        expected = problem.Model()(*inputs)
        return namespace["ModelNew"]()(*inputs), expected


def judged(path: Path, source: str, device: str = "cpu", launches: int | None = None
           ) -> Verdict:
    """The evaluator's verdict on `source` for the site problem at `path`, asserted correct
    (and, given `launches`, launching that many kernels, with no library op); timed on CUDA."""
    verdict = evaluate(path, source, EvalConfig(device=device, time=device == "cuda"))
    assert verdict.correct, verdict.reason
    if launches is not None:
        assert verdict.kernel_launches == launches and verdict.library_ops == [], (
            f"{verdict.kernel_launches} launches, library ops {verdict.library_ops}")
    return verdict


def first_draft(path: Path, n: int = 2) -> Proposal:
    """The rules generator's first draft for the site problem at `path`."""
    drafts = RulesGenerator().propose(path, None, n=n).children
    assert drafts, f"the rules generator drafts no kernel for {path.name}"
    return drafts[0]


def one_input_problem(folder: Path, body: str, inputs: str, params: str = "x") -> Path:
    """`folder/problem.py`: a KernelBench problem whose Model returns `body` of its input `x`
    (or of the inputs `params` names, `F` being torch.nn.functional), drawn by the
    expression(s) `inputs`."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "problem.py"
    path.write_text("import torch\nimport torch.nn as nn\nimport torch.nn.functional as F\n\n\n"
                    "class Model(nn.Module):\n"
                    f"    def forward(self, {params}):\n        return {body}\n\n\n"
                    f"def get_inputs():\n    return [{inputs}]\n\n\n"
                    "def get_init_inputs():\n    return []\n")
    return path
