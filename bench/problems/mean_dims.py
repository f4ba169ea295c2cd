"""Mean over dimensions 0 and 1 (every token of every sequence): per-feature activation
means, as calibration statistics are gathered. A reduction over the two leading dimensions
at once, the last one kept. 16 sequences of 4096 tokens x 1024 features, fp32: 256 MiB
read."""

import torch
import torch.nn as nn

BATCH = 16
TOKENS = 4096
HIDDEN = 1024


class Model(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.mean(dim=(0, 1))


def get_inputs():
    return [torch.randn(BATCH, TOKENS, HIDDEN)]


def get_init_inputs():
    return []
