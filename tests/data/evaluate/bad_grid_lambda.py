"""Attack: computes the answer with torch inside the launch grid's callable, where the
old guard did not look; its kernel only touches one element."""
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



class ModelNew(nn.Module):
    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        out = torch.empty_like(x)
        grid = lambda meta: (out.copy_(x * y + x).numel() * 0 + 1,)  # noqa: E731
        fused_kernel[grid](x, y, out, 1, BLOCK=256)
        return out
