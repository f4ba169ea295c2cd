"""Causal scaled_dot_product_attention: an attention site (the flash-attention kernel in
eager PyTorch). 8 sequences x 16 heads x 2048 tokens, head size 128: 275 GFLOP counted as
for a full mask, half of which the causal mask skips."""

import torch
import torch.nn as nn
import torch.nn.functional as F

BATCH = 8
HEADS = 16
SEQ = 2048
HEAD_DIM = 128


class Model(nn.Module):
    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)


def get_inputs():
    shape = (BATCH, HEADS, SEQ, HEAD_DIM)
    return [torch.randn(shape), torch.randn(shape), torch.randn(shape)]


def get_init_inputs():
    return []
