"""Softmax over dimension 1 of a 4-D tensor: per-pixel class probabilities of a
segmentation head (ADE20K's 150 classes). The reduced dimension is strided, not the last.
16 images at 128 x 128, fp32: 150 MiB read, 150 MiB written."""

import torch
import torch.nn as nn

BATCH = 16
CLASSES = 150
SIZE = 128


class Model(nn.Module):
    def forward(self, logits: torch.Tensor) -> torch.Tensor:
        return torch.softmax(logits, dim=1)


def get_inputs():
    return [torch.randn(BATCH, CLASSES, SIZE, SIZE)]


def get_init_inputs():
    return []
