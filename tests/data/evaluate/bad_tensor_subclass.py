"""Attack: returns a tensor subclass whose comparisons and arithmetic lie."""
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def fused_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    x = tl.load(x_ptr + offsets, mask=mask)
    y = tl.load(y_ptr + offsets, mask=mask)
    tl.store(out_ptr + offsets, x * y + x, mask=mask)


class Liar(torch.Tensor):
    def __sub__(self, other):
        return torch.zeros_like(other)

    def __eq__(self, other):
        return torch.ones_like(other, dtype=torch.bool)


class ModelNew(nn.Module):
    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        out = torch.empty_like(x)
        fused_kernel[(1,)](x, y, out, 1, BLOCK=256)
        return Liar(out)
