"""GroupNorm: statistics over each group of channels and all its pixels (a reduction over
several trailing dimensions at once), then a per-channel affine map. 16 images of 512
channels at 64 x 64, 32 groups, fp32: 128 MiB read, 128 MiB written."""

import torch
import torch.nn as nn

BATCH = 16
CHANNELS = 512
SIZE = 64
GROUPS = 32


class Model(nn.Module):
    def __init__(self, groups: int, channels: int):
        super().__init__()
        self.norm = nn.GroupNorm(groups, channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(x)


def get_inputs():
    return [torch.randn(BATCH, CHANNELS, SIZE, SIZE)]


def get_init_inputs():
    return [GROUPS, CHANNELS]
