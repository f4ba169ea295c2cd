"""A module that warns does not split the model's graph: its ops stay in the captured graph, where
Kiln can make them a site."""

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
