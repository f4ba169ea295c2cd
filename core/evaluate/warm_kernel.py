"""A tiny candidate the zygote judges once, in its own process (`zygote.warm_up`), so that no
candidate's process pays for the first-time work of the path every call takes: importing a
candidate file, the guard's dispatch mode, shared memory, the Triton interpreter; and on a GPU
its kernel compiled once, so that no candidate's process starts Triton's compiler cold."""

from __future__ import annotations

import base64
import os
import pickle
import tempfile
from pathlib import Path

import torch
import torch.nn as nn
import triton
import triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource


@triton.jit
def _double_kernel(source, target, n, BLOCK: tl.constexpr):
    offsets = tl.arange(0, BLOCK)
    mask = offsets < n
    tl.store(target + offsets, tl.load(source + offsets, mask=mask) * 2.0, mask=mask)


class ModelNew(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.empty_like(x)
        _double_kernel[(1,)](x, out, x.numel(), BLOCK=8)
        return out


def judge_once() -> None:
    """Build this module as a candidate and call it twice, through the runner's own code."""
    from core.evaluate.exchange import JudgeSide
    from core.evaluate.runner import Runner

    runner = Runner(None, torch.device("cpu"))  # type: ignore[arg-type]
    init = base64.b64encode(pickle.dumps([])).decode()
    runner.handle({"op": "build", "path": str(Path(__file__)), "module": "kiln_warm_candidate",
                   "seed": 0, "tf32": False, "init": init}, [])
    side = JudgeSide()
    for _ in range(2):
        shared = side.shared_copy(torch.ones(8), "input 0")
        records, fds = side.encode_inputs([shared])
        # A message would carry copies of the descriptors: so do these.
        copies = [os.dup(fd) for fd in fds]
        runner.handle({"op": "call", "inputs": records, "forget": []}, copies)
        runner.side.keep.clear()


def compile_once() -> None:
    """Compile the kernel to a cubin, with no GPU: Triton's compiler (its MLIR passes, LLVM's
    NVPTX backend) starts once here, in the zygote, instead of in every candidate's process
    (bench/NOTES.md, 2026-12-05: a child of a process that compiled once compiles its first
    kernel several times faster, whatever the architecture compiled for). A cache of its own,
    dropped after: a kernel found in a cache would leave the compiler cold."""
    if os.environ.get("TRITON_INTERPRET") == "1":
        return  # kernels are interpreted: there is no compiler to start
    source = ASTSource(_double_kernel, {"source": "*fp32", "target": "*fp32", "n": "i32",
                                        "BLOCK": "constexpr"}, constexprs={"BLOCK": 8})
    with tempfile.TemporaryDirectory() as cache, triton.knobs.cache.scope():
        triton.knobs.cache.dir = cache
        triton.compile(source, target=GPUTarget("cuda", 90, 32))
