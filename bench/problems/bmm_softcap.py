"""Batched matmul + scale + tanh soft-capping: attention logits as Gemma 2 computes them,
cap * tanh(q k^T * scale / cap). A matmul site with a softmax-free pointwise epilogue.
64 (batch x heads) products of 2048 x 128 by 128 x 2048: 69 GFLOP, 512 MiB of logits in
bf16."""

import math

import torch
import torch.nn as nn

BATCH_HEADS = 64
SEQ = 2048
HEAD_DIM = 128
SOFT_CAP = 50.0


class Model(nn.Module):
    def __init__(self, head_dim: int, soft_cap: float):
        super().__init__()
        self.scale = 1.0 / math.sqrt(head_dim)
        self.soft_cap = soft_cap

    def forward(self, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
        logits = torch.bmm(q, k.transpose(1, 2)) * self.scale
        return self.soft_cap * torch.tanh(logits / self.soft_cap)


def get_inputs():
    return [torch.randn(BATCH_HEADS, SEQ, HEAD_DIM), torch.randn(BATCH_HEADS, SEQ, HEAD_DIM)]


def get_init_inputs():
    return [HEAD_DIM, SOFT_CAP]
