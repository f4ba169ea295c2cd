"""Attention written out: softmax(q k^T * scale) @ v. Two batched matmuls around a softmax,
the scores materialized (512 MiB in bf16), as a fused attention kernel would avoid.
4 sequences x 16 heads x 2048 tokens, head size 64: 69 GFLOP."""

import math

import torch
import torch.nn as nn

BATCH = 4
HEADS = 16
SEQ = 2048
HEAD_DIM = 64


class Model(nn.Module):
    def __init__(self, head_dim: int):
        super().__init__()
        self.scale = 1.0 / math.sqrt(head_dim)

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        scores = q @ k.transpose(-2, -1) * self.scale
        return torch.softmax(scores, dim=-1) @ v


def get_inputs():
    shape = (BATCH, HEADS, SEQ, HEAD_DIM)
    return [torch.randn(shape), torch.randn(shape), torch.randn(shape)]


def get_init_inputs():
    return [HEAD_DIM]
