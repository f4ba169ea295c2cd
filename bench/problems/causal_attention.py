"""Causal attention as GPT-2 small writes it out: softmax over q k^T * scale with the future
masked by masked_fill of a lower-triangular buffer, then @ v. An attention site whose scores
(384 MiB in fp32) a fused kernel never stores, and whose masked tiles it skips.
8 sequences x 12 heads x 1024 tokens, head size 64: 26 GFLOP counted as for a full mask."""

import math

import torch
import torch.nn as nn

BATCH = 8
HEADS = 12
SEQ = 1024
HEAD_DIM = 64


class Model(nn.Module):
    def __init__(self, seq: int, head_dim: int):
        super().__init__()
        self.scale = 1.0 / math.sqrt(head_dim)
        causal = torch.tril(torch.ones(seq, seq, dtype=torch.bool))
        self.register_buffer("bias", causal.view(1, 1, seq, seq), persistent=False)

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        tokens = q.size(-2)
        scores = (q @ k.transpose(-2, -1)) * self.scale
        scores = scores.masked_fill(~self.bias[:, :, :tokens, :tokens], float("-inf"))
        return torch.softmax(scores, dim=-1) @ v


def get_inputs():
    shape = (BATCH, HEADS, SEQ, HEAD_DIM)
    return [torch.randn(shape), torch.randn(shape), torch.randn(shape)]


def get_init_inputs():
    return [SEQ, HEAD_DIM]
