"""Tier 2: the pointwise site in CUDA C++, loaded and launched through Kiln's CUDA runtime."""
import torch
import torch.nn as nn

from core.runtime.cuda import load_kernel

SOURCE = r"""
__global__ void fused(const float* x, const float* y, float* out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        out[i] = x[i] * y[i] + x[i];
    }
}
"""


class ModelNew(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.kernel = load_kernel(SOURCE, "fused", "PPPi")

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        out = torch.empty_like(x)
        n = x.numel()
        self.kernel(grid=((n + 255) // 256, 1, 1), block=(256, 1, 1), args=(x, y, out, n))
        return out
