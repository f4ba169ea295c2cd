"""KernelBench style: parameters are built in __init__ from get_init_inputs()."""
import torch
import torch.nn as nn

BATCH, IN_FEATURES, OUT_FEATURES = 8, 20, 12


class Model(nn.Module):
    def __init__(self, in_features: int, out_features: int) -> None:
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.linear(x))


def get_inputs():
    return [torch.randn(BATCH, IN_FEATURES)]


def get_init_inputs():
    return [IN_FEATURES, OUT_FEATURES]
