"""GELU with the tanh approximation, written out as GPT-2's code does:
0.5 * x * (1 + tanh(sqrt(2 / pi) * (x + 0.044715 * x^3))). Eight captured ops that read one
tensor: a pointwise chain that eager PyTorch runs as eight passes over memory.
8192 x 8192 in fp32: 256 MiB read, 256 MiB written."""

import math

import torch
import torch.nn as nn

ROWS = 8192
COLUMNS = 8192


class Model(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        inner = math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))
        return 0.5 * x * (1.0 + torch.tanh(inner))


def get_inputs():
    return [torch.randn(ROWS, COLUMNS)]


def get_init_inputs():
    return []
