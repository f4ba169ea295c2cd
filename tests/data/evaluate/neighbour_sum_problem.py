import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + F.pad(x[:-1], (1, 0))


def get_inputs():
    return [torch.randn(1000)]


def get_init_inputs():
    return []
