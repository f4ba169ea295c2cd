"""Sites that span what used to be several (a GEMM with its rows reduced or its operand's chain,
a conv with its activation and pooling, ReLU attention, a depthwise conv), captured from one
model, drafted by the rules generator and installed back: the model stays correct."""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from core.runtime.install import install
from tests.test_install import assert_close, site_kernels


class Fused(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)
        self.depthwise = nn.Conv2d(4, 4, 3, padding=1, groups=4)
        self.head = nn.Linear(16, 24)

    def forward(self, image: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor):
        pooled = F.max_pool2d(torch.relu(self.conv(image)), 2)  # [2, 4, 4, 4]
        rows = self.depthwise(pooled).flatten(1)  # [2, 64]
        scores = torch.logsumexp(self.head(F.gelu(rows.view(8, 16) * 0.5)), dim=1)
        attention = torch.relu(q @ k.transpose(-2, -1) * 0.3) @ v
        return scores, attention


def test_each_fused_site_gets_a_kernel_and_the_installed_model_stays_correct(tmp_path):
    model = Fused().eval()
    torch.manual_seed(0)
    inputs = (torch.randn(2, 3, 10, 10), *(torch.randn(2, 3, 9, 8) for _ in range(3)))
    kernels = site_kernels(model, inputs, tmp_path)
    families = sorted(k.key.split("-")[0] for k in kernels)
    # The pooling joins its convolution's site: cuDNN's convolution, then one kernel.
    assert families == ["attention", "conv", "conv", "matmul"], families
    torch._dynamo.reset()
    installed = install(model, kernels, rest="eager")
    with torch.no_grad():
        assert_close(installed(*inputs), model(*inputs), "the fused sites installed")
    assert installed.stats() == {f"{k.key}: kernel": 1 for k in kernels}, installed.stats()
