"""Broken: a race. Each block updates a working copy in place, and reads its left neighbour's
last element from that same copy; whether the neighbour has already overwritten it depends on
which block runs first."""
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def neighbour_sum_in_place(buf_ptr, n, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    x = tl.load(buf_ptr + offsets, mask=mask)
    left = tl.load(buf_ptr + offsets - 1, mask=mask & (offsets > 0), other=0.0)
    tl.store(buf_ptr + offsets, x + left, mask=mask)


class ModelNew(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        buf = x.clone()
        neighbour_sum_in_place[(triton.cdiv(x.numel(), 128),)](buf, x.numel(), BLOCK=128)
        return buf
