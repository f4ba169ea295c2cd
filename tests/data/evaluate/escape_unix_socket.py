"""Escape: connects to a Unix socket bound to a path on this machine (the test's, at PATH), which
no network namespace hides.

It passes no static rule; the sandbox tests hand it to a worker directly."""
import socket

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


PATH = "/nonexistent/socket"  # the test writes its own


class ModelNew(nn.Module):
    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        out = torch.empty_like(x)
        n = x.numel()
        fused_kernel[(triton.cdiv(n, 256),)](x, y, out, n, BLOCK=256)
        try:
            client = socket.socket(socket.AF_UNIX)
            client.connect(PATH)
            client.sendall(b"leak")
            result = "connected"
        except OSError as err:
            result = f"refused: {err}"
        raise RuntimeError(f"unix socket {result}")
        return out
