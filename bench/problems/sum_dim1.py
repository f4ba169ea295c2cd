"""Sum over dimension 1 (the tokens of a batch of sequences, as sum-pooling does): a
reduction over a middle dimension, where each output reads a strided column.
32 sequences of 2048 tokens x 1024 features, fp32: 256 MiB read."""

import torch
import torch.nn as nn

BATCH = 32
TOKENS = 2048
HIDDEN = 1024


class Model(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.sum(dim=1)


def get_inputs():
    return [torch.randn(BATCH, TOKENS, HIDDEN)]


def get_init_inputs():
    return []
