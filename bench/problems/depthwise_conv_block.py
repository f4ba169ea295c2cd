"""Depthwise-separable block as in MobileNetV2: depthwise 3x3 conv + bias + ReLU6, then a
pointwise 1x1 projection. The depthwise conv is memory-bound (9 multiply-adds per element
read). 64 images of 192 channels at 56 x 56: 147 MiB per activation in fp32, 74 MiB in
bf16."""

import torch
import torch.nn as nn
import torch.nn.functional as F

BATCH = 64
CHANNELS = 192
OUT_CHANNELS = 64
SIZE = 56


class Model(nn.Module):
    def __init__(self, channels: int, out_channels: int):
        super().__init__()
        self.depthwise = nn.Conv2d(channels, channels, kernel_size=3, padding=1, groups=channels)
        self.pointwise = nn.Conv2d(channels, out_channels, kernel_size=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.pointwise(F.relu6(self.depthwise(x)))


def get_inputs():
    return [torch.randn(BATCH, CHANNELS, SIZE, SIZE)]


def get_init_inputs():
    return [CHANNELS, OUT_CHANNELS]
