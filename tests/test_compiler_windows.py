"""Pooling and depthwise convolution as sites of the kernel compiler: how they are cut into sites,
drafted by the rules generator and judged; other convolutions are cuDNN's, called before the
kernels."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from core.evaluate import EvalConfig, evaluate
from generators.compiler.site import declined
from generators.rules import RulesGenerator
from tests.test_partition import sites_of


def problem(folder: Path, params: str, body: str, inputs: str) -> Path:
    path = folder / "problem.py"
    path.write_text("import torch\nimport torch.nn as nn\nimport torch.nn.functional as F\n\n\n"
                    f"class Model(nn.Module):\n    def forward(self, {params}):\n"
                    f"        return {body}\n\n\n"
                    f"def get_inputs():\n    return [{inputs}]\n\n\n"
                    "def get_init_inputs():\n    return []\n")
    return path


def test_a_conv_takes_the_pooling_of_its_activation():
    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(3, 8, 3)
            self.depthwise = nn.Conv2d(8, 8, 3, padding=1, groups=8)

        def forward(self, x):
            pooled = F.max_pool2d(torch.relu(self.conv(x)), 2)
            return F.avg_pool2d(self.depthwise(pooled) * 0.5, 2, 1)

    table = sites_of(Model(), torch.randn(2, 3, 12, 12))
    # Each pooling joins its convolution's site: cuDNN's (or the depthwise windows), then the
    # activation and the pooling in the kernels.
    assert sorted((s.family, s.problem.ops) for s in table.sites) == [
        ("conv", ("conv2d", "mul", "avg_pool2d")), ("conv", ("conv2d", "relu", "max_pool2d"))]


@pytest.mark.parametrize(("params", "body", "inputs"), [
    ("x", "F.max_pool2d(torch.relu(x), 3, 2, 1)", "torch.randn(2, 4, 11, 9)"),
    ("x, w, b", "torch.relu(F.conv2d(x, w, b, padding=1, groups=4))",
     "torch.randn(2, 4, 11, 9), torch.randn(4, 1, 3, 3), torch.randn(4)"),
])
def test_the_first_draft_is_judged_correct(params, body, inputs, tmp_path):
    path = problem(tmp_path, params, body, inputs)
    verdict = first_draft_verdict(path)
    assert verdict.correct, verdict.reason
    assert verdict.library_ops == [], "the convolution is the kernel's own work"


def first_draft_verdict(path: Path):
    assert declined(path) is None
    drafts = RulesGenerator().propose(path, None, n=8).children
    compiled = [d for d in drafts if d.settings.get("writer") == "write_compiled"]
    assert compiled, [d.rationale for d in drafts]
    return evaluate(path, compiled[0].source, EvalConfig(device="cpu", time=False))


@pytest.mark.parametrize(("params", "body", "inputs", "library"), [
    # cuDNN's convolution, then the activation and the pooling's windows over its output.
    ("x, w, b", "F.max_pool2d(torch.relu(F.conv2d(x, w, b)), 2)",
     "torch.randn(2, 3, 12, 12), torch.randn(8, 3, 3, 3), torch.randn(8)", ["aten.convolution"]),
    # A depthwise convolution's windows, then the pooling's windows over them.
    ("x, w, b", "F.avg_pool2d(F.conv2d(x, w, b, padding=1, groups=8) * 0.5, 2, 1)",
     "torch.randn(2, 8, 9, 7), torch.randn(8, 1, 3, 3), torch.randn(8)", []),
])
def test_a_convolution_with_its_pooling_is_judged_correct(params, body, inputs, library,
                                                          tmp_path):
    verdict = first_draft_verdict(problem(tmp_path, params, body, inputs))
    assert verdict.correct, verdict.reason
    assert verdict.library_ops == library


@pytest.mark.parametrize(("params", "body", "inputs", "reason"), [
    ("x, w", "F.conv2d(x, w)", "torch.randn(1, 4, 6, 6), torch.randn(2, 4, 3, 3)",
     "nothing for a kernel to do"),
    ("x", "F.max_pool2d(x, 2, ceil_mode=True)", "torch.randn(1, 2, 5, 5)", "ceil_mode"),
    ("x", "F.max_pool2d(x, 2, return_indices=True)[1].float()", "torch.randn(1, 2, 4, 4)",
     "indices of a max pooling"),
    ("x", "F.avg_pool2d(x, 3, 1, 1, count_include_pad=False)", "torch.randn(1, 2, 5, 5)",
     "without the padding in its count"),
    ("x", "F.adaptive_avg_pool2d(x, 3)", "torch.randn(1, 2, 8, 8)", "uneven windows"),
    ("x, w", "F.conv2d(x, w, padding=3, groups=2)", "torch.randn(1, 2, 2, 2), "
     "torch.randn(2, 1, 3, 3)", "as wide as the input"),
])
def test_what_the_windows_cannot_compute_is_declined_with_the_reason(params, body, inputs,
                                                                     reason, tmp_path):
    found = declined(problem(tmp_path, params, body, inputs))
    assert found is not None and reason in found, found
