"""The matmul goes to the library (the site's anchor op); the bias and GELU epilogue is a kernel."""
import torch
import torch.nn as nn
import torch.nn.functional as F
import triton
import triton.language as tl


@triton.jit
def bias_gelu_kernel(acc_ptr, bias_ptr, out_ptr, n, cols, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    z = tl.load(acc_ptr + offsets, mask=mask) + tl.load(bias_ptr + offsets % cols, mask=mask)
    gelu = 0.5 * z * (1.0 + tl.erf(z * 0.7071067811865476))
    tl.store(out_ptr + offsets, gelu, mask=mask)


class ModelNew(nn.Module):
    def forward(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        acc = F.linear(x, weight)
        out = torch.empty_like(acc)
        n = acc.numel()
        bias_gelu_kernel[(triton.cdiv(n, 128),)](acc, bias, out, n, acc.shape[-1], BLOCK=128)
        return out
