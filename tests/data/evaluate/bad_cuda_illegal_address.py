"""Crash on the GPU: writes a terabyte past its output, an illegal address that poisons the context.

(A null pointer is not enough: on an H200 a write to address 0 completed without an error.)"""
import torch
import torch.nn as nn

from core.runtime.cuda import load_kernel

SOURCE = r"""
__global__ void fused(const float* x, const float* y, float* out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    float* nowhere = out + (1ull << 38);
    if (i < n) {
        nowhere[i] = x[i] * y[i] + x[i];
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
