"""Escape: kills the judge's process, by its PID and by finding its command line in /proc.

It passes no static rule; the sandbox tests hand it to a worker directly."""
import os
import signal

import torch
import torch.nn as nn
import triton
import triton.language as tl

JUDGE_PID = 0


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
        n = x.numel()
        fused_kernel[(triton.cdiv(n, 256),)](x, y, out, n, BLOCK=256)
        results = []
        try:
            os.kill(JUDGE_PID, signal.SIGKILL)
            results.append("killed")
        except OSError as err:
            results.append(err.strerror)
        for pid in os.listdir("/proc"):
            if not pid.isdigit():
                continue
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as handle:
                    judge = b"core.evaluate.worker" in handle.read()
                if judge and int(pid) != os.getpid():
                    os.kill(int(pid), signal.SIGKILL)
                    results.append("killed")
            except OSError as err:
                results.append(err.strerror)
        raise RuntimeError(f"kill attempts: {sorted(set(results))}")
        return out
