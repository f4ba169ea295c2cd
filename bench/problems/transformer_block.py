"""A pre-norm GPT decoder block: LayerNorm, fused QKV projection, causal
scaled_dot_product_attention, output projection + residual, LayerNorm, MLP with tanh-GELU,
residual. Every family at once, with the views between heads and tokens that sites must
see through. 16 sequences of 512 tokens, width 1024, 16 heads: 223 GFLOP."""

import torch
import torch.nn as nn
import torch.nn.functional as F

BATCH = 16
SEQ = 512
HIDDEN = 1024
HEADS = 16


class Model(nn.Module):
    def __init__(self, hidden: int, heads: int):
        super().__init__()
        self.heads = heads
        self.attn_norm = nn.LayerNorm(hidden)
        self.qkv = nn.Linear(hidden, 3 * hidden)
        self.out = nn.Linear(hidden, hidden)
        self.mlp_norm = nn.LayerNorm(hidden)
        self.up = nn.Linear(hidden, 4 * hidden)
        self.down = nn.Linear(4 * hidden, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, hidden = x.shape
        q, k, v = self.qkv(self.attn_norm(x)).split(hidden, dim=-1)
        q, k, v = (t.view(batch, seq, self.heads, -1).transpose(1, 2) for t in (q, k, v))
        attended = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.out(attended.transpose(1, 2).reshape(batch, seq, hidden))
        return x + self.down(F.gelu(self.up(self.mlp_norm(x)), approximate="tanh"))


def get_inputs():
    return [torch.randn(BATCH, SEQ, HIDDEN)]


def get_init_inputs():
    return [HIDDEN, HEADS]
