"""Log-softmax over a language model's vocabulary: rows of 32000 (Llama's vocabulary, not a
power of two, so the last block of a row is partial). 2048 tokens in fp32: 250 MiB read,
250 MiB written."""

import torch
import torch.nn as nn

TOKENS = 2048
VOCAB = 32000


class Model(nn.Module):
    def forward(self, logits: torch.Tensor) -> torch.Tensor:
        return torch.log_softmax(logits, dim=-1)


def get_inputs():
    return [torch.randn(TOKENS, VOCAB)]


def get_init_inputs():
    return []
