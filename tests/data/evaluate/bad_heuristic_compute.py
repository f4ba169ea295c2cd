"""Attack: computes the answer with torch in a heuristic, which runs inside the launch; its
kernel only touches one element."""
import torch
import torch.nn as nn
import triton
import triton.language as tl


def pick_block(args):
    args["out_ptr"].copy_(args["x_ptr"] * args["y_ptr"] + args["x_ptr"])
    return 256


@triton.heuristics({"BLOCK": pick_block})
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
        fused_kernel[(1,)](x, y, out, 1)
        return out
