"""x * sigmoid(x) + bias: a pure pointwise chain whose last operand broadcasts a
per-column bias over every row. 8192 x 8192 in fp32: 256 MiB read, 256 MiB written."""

import torch
import torch.nn as nn

ROWS = 8192
COLUMNS = 8192


class Model(nn.Module):
    def __init__(self, columns: int):
        super().__init__()
        self.bias = nn.Parameter(torch.randn(columns) * 0.02)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.sigmoid(x) + self.bias


def get_inputs():
    return [torch.randn(ROWS, COLUMNS)]


def get_init_inputs():
    return [COLUMNS]
