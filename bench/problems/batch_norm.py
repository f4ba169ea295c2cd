"""BatchNorm2d with batch statistics: per-channel mean and variance over the batch and
all pixels (a reduction over dimensions 0, 2 and 3), then normalization. The module keeps
no running statistics, so it normalizes with the batch's own statistics in eval mode too,
which is how Kiln runs models. 64 images of 256 channels at 56 x 56, fp32: 196 MiB read,
196 MiB written."""

import torch
import torch.nn as nn

BATCH = 64
CHANNELS = 256
SIZE = 56


class Model(nn.Module):
    def __init__(self, channels: int):
        super().__init__()
        self.norm = nn.BatchNorm2d(channels, track_running_stats=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(x)


def get_inputs():
    return [torch.randn(BATCH, CHANNELS, SIZE, SIZE)]


def get_init_inputs():
    return [CHANNELS]
