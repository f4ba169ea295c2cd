"""Escape: writes a file outside its scratch folder (the test's OUTSIDE), and one inside it.

It passes no static rule; the sandbox tests hand it to a worker directly."""
import os

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


OUTSIDE = "/nonexistent/outside"  # the test writes its own


class ModelNew(nn.Module):
    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        out = torch.empty_like(x)
        n = x.numel()
        fused_kernel[(triton.cdiv(n, 256),)](x, y, out, n, BLOCK=256)
        results = []
        for path in (OUTSIDE, os.path.join(os.getcwd(), "inside.txt")):
            try:
                with open(path, "w") as handle:
                    handle.write("pwned")
                results.append("written")
            except OSError as err:
                results.append(f"refused ({err.strerror})")
        raise RuntimeError(f"outside {results[0]}, inside {results[1]}")
        return out
