"""Absolute maximum over dimension 0: per-channel scales for fp8 quantization,
x.abs().amax(dim=0). A pointwise prologue and a reduction over the leading dimension.
16384 tokens x 4096 channels, fp32: 256 MiB read."""

import torch
import torch.nn as nn

TOKENS = 16384
CHANNELS = 4096


class Model(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.abs().amax(dim=0)


def get_inputs():
    return [torch.randn(TOKENS, CHANNELS)]


def get_init_inputs():
    return []
