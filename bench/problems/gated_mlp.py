"""Gated MLP (SwiGLU) as in Llama: down(SiLU(x W1) * (x W3)), bias-free. Two matmuls that
share their input and meet in a SiLU-and-multiply epilogue, then a third. Llama-7B widths
(4096 -> 11008 -> 4096) over 4096 tokens: 1.1 TFLOP."""

import torch
import torch.nn as nn
import torch.nn.functional as F

TOKENS = 4096
HIDDEN = 4096
INTERMEDIATE = 11008


class Model(nn.Module):
    def __init__(self, hidden: int, intermediate: int):
        super().__init__()
        self.gate = nn.Linear(hidden, intermediate, bias=False)
        self.up = nn.Linear(hidden, intermediate, bias=False)
        self.down = nn.Linear(intermediate, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(F.silu(self.gate(x)) * self.up(x))


def get_inputs():
    return [torch.randn(TOKENS, HIDDEN)]


def get_init_inputs():
    return [HIDDEN, INTERMEDIATE]
