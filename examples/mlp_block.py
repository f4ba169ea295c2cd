"""A small transformer-style MLP block in KernelBench format: Kiln's bundled example."""

import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def __init__(self, hidden: int = 128, expansion: int = 4):
        super().__init__()
        self.norm = nn.LayerNorm(hidden)
        self.up = nn.Linear(hidden, hidden * expansion)
        self.down = nn.Linear(hidden * expansion, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.up(self.norm(x))
        h = F.gelu(h)
        return x + self.down(h) * 0.5


def get_inputs():
    return [torch.randn(8, 32, 128)]


def get_init_inputs():
    return []
