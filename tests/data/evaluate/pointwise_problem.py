import torch
import torch.nn as nn

# An odd length, so a kernel that forgets the tail block is caught.
N = 1037


class Model(nn.Module):
    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return x * y + x


def get_inputs():
    return [torch.randn(N), torch.randn(N)]


def get_init_inputs():
    return []
