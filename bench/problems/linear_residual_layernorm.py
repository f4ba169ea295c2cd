"""Linear + residual add + LayerNorm: a post-norm transformer's attention output
projection (BERT-style). A matmul site whose epilogue is the residual add, followed by a
row normalization. 8192 tokens of width 4096: 275 GFLOP."""

import torch
import torch.nn as nn

TOKENS = 8192
HIDDEN = 4096


class Model(nn.Module):
    def __init__(self, hidden: int):
        super().__init__()
        self.proj = nn.Linear(hidden, hidden)
        self.norm = nn.LayerNorm(hidden)

    def forward(self, attended: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        return self.norm(residual + self.proj(attended))


def get_inputs():
    return [torch.randn(TOKENS, HIDDEN), torch.randn(TOKENS, HIDDEN)]


def get_init_inputs():
    return [HIDDEN]
