"""What Kiln asks of torch.compile: a module that warns does not split the graph, and
nn.MultiheadAttention is traced through; either way the ops stay in the captured graph, where
Kiln can make them sites."""

from __future__ import annotations

import warnings

import torch
import torch.nn as nn

from core.profile.roofline import GpuPeaks
from core.profile.sites import find_sites
from core.runtime.capture import capture
from core.runtime.install import install

CPU = torch.device("cpu")


class WarnsOnItsInput(nn.Module):
    """KernelBench's BMM + InstanceNorm: InstanceNorm2d warns that the input's channels do not
    match num_features, on every call."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(32, 24)
        self.norm = nn.InstanceNorm2d(24)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        x = self.norm(self.linear(x).unsqueeze(1).unsqueeze(1)).squeeze(1).squeeze(1)
        return (x + y) * y


def test_a_warning_is_no_graph_break_and_its_ops_are_a_site():
    torch.manual_seed(0)
    model, inputs = WarnsOnItsInput().eval(), [torch.randn(8, 32), torch.randn(8, 24)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        captured = capture(model, inputs, CPU)
    assert len(captured.graphs) == 1
    families = {site.family for site in find_sites(captured, GpuPeaks()).sites}
    assert "reduction" in families, families


def test_the_installed_model_keeps_one_graph_and_its_answer():
    torch.manual_seed(0)
    model, inputs = WarnsOnItsInput().eval(), [torch.randn(8, 32), torch.randn(8, 24)]
    installed = install(model, [], rest="inductor")
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.testing.assert_close(installed(*inputs), model(*inputs))


class SelfAttention(nn.Module):
    """ViT's attention block: nn.MultiheadAttention, which calls
    F.multi_head_attention_forward."""

    def __init__(self) -> None:
        super().__init__()
        self.attention = nn.MultiheadAttention(32, 4, batch_first=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.attention(x, x, x, need_weights=False)[0]


def test_multihead_attention_becomes_matmul_and_attention_sites():
    torch.manual_seed(0)
    model, inputs = SelfAttention().eval(), [torch.randn(2, 8, 32)]
    with torch.no_grad():
        captured = capture(model, inputs, CPU)
    families = [site.family for site in find_sites(captured, GpuPeaks()).sites]
    assert "attention" in families and "matmul" in families, families
    assert "other" not in families, families
    installed = install(model, [], rest="inductor")
    with torch.no_grad():
        torch.testing.assert_close(installed(*inputs), model(*inputs))
