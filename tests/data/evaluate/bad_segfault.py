"""Crash: stores through a wild pointer, far outside any allocation."""
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def wild_kernel(out_ptr, n, BLOCK: tl.constexpr):
    offsets = tl.arange(0, BLOCK)
    tl.store(out_ptr + offsets + (1 << 40), offsets.to(tl.float32), mask=offsets < n)


class ModelNew(nn.Module):
    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        out = torch.empty_like(x)
        wild_kernel[(1,)](out, x.numel(), BLOCK=256)
        return out
