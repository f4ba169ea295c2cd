import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def forward(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        return F.gelu(F.linear(x, weight, bias))


def get_inputs():
    return [torch.randn(16, 32), torch.randn(24, 32) / 6, torch.randn(24)]


def get_init_inputs():
    return []
