"""Linear + bias + GELU: a transformer MLP's up-projection, a matmul site with a pointwise
epilogue (the exact, erf-based GELU). 8192 tokens, 4096 -> 16384 features: 1.1 TFLOP."""

import torch
import torch.nn as nn
import torch.nn.functional as F

TOKENS = 8192
IN_FEATURES = 4096
OUT_FEATURES = 16384


class Model(nn.Module):
    def __init__(self, in_features: int, out_features: int):
        super().__init__()
        self.up = nn.Linear(in_features, out_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.gelu(self.up(x))


def get_inputs():
    return [torch.randn(TOKENS, IN_FEATURES)]


def get_init_inputs():
    return [IN_FEATURES, OUT_FEATURES]
