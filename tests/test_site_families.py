"""Ops PyTorch spells as one call (a loss, a running maximum) are sites of the family that
computes them, so that the kernel compiler is asked for them, not left to PyTorch unasked."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from core.profile.roofline import GpuPeaks
from core.profile.sites import find_sites
from core.runtime.capture import capture

X = torch.randn(8, 40)


class Lambda(nn.Module):
    def __init__(self, body: str) -> None:
        super().__init__()
        self.body = eval(f"lambda x, y, z: {body}", {"torch": torch, "F": F})

    def forward(self, x, y, z):
        return self.body(x, y, z)


@pytest.mark.parametrize("body", [
    "F.triplet_margin_loss(x, y, z)",
    "F.margin_ranking_loss(x, y, torch.sign(z))",
    "F.pairwise_distance(x, y)",
    "F.poisson_nll_loss(x, y.abs())",
    "F.multilabel_soft_margin_loss(x, (y > 0).float())",
    "torch.nansum(x, dim=1)",
    "torch.count_nonzero(x > 0.5, dim=1)",
    "torch.dist(x, y)",
    "torch.logcumsumexp(x, dim=1)",
    "torch.cummax(x, dim=1)[0]",
    "torch.cummin(x, dim=0).values",
])
def test_a_loss_or_running_value_is_a_reduction_site(body):
    captured = capture(Lambda(body).eval(), [X, torch.randn(8, 40), torch.randn(8, 40)],
                       torch.device("cpu"))
    families = {site.family for site in find_sites(captured, GpuPeaks()).sites}
    assert "reduction" in families and "other" not in families, (body, families)
