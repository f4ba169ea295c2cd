"""Which of the sandbox's walls let CUDA start, on a GPU host: one table row a case.

    python bench/sandbox_cuda_probe.py

Each case is a child forked in a PID namespace of its own (as a candidate's process is) that
takes some of the walls (`core.evaluate.sandbox`), before or after it starts CUDA, then compiles
and runs a Triton kernel, a cuBLAS product, and shares a tensor as CUDA IPC does. The answer
says which walls must wait until CUDA has started (bench/NOTES.md, 2026-12-05: a PID namespace
under the parent's /proc, and confinement before CUDA's start, both give error 304).
"""

from __future__ import annotations

import ctypes
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from core.evaluate import sandbox  # noqa: E402
from core.evaluate.zygote import start_cuda  # noqa: E402

_libc = ctypes.CDLL(None, use_errno=True)
# (name, walls taken before CUDA starts, walls taken after, whether /proc is its own)
CASES = [
    ("parent's /proc", (), (), False),
    ("own /proc", (), (), True),
    ("limits, then CUDA", ("limits",), (), True),
    ("Landlock, then CUDA", ("landlock",), (), True),
    ("seccomp, then CUDA", ("seccomp",), (), True),
    ("CUDA, then every wall", (), ("limits", "landlock", "seccomp"), True),
]


def work() -> dict[str, float]:
    """A Triton kernel compiled and run, a cuBLAS product, a tensor shared for IPC."""
    import triton
    import triton.language as tl
    from torch.multiprocessing.reductions import reduce_tensor

    @triton.jit
    def double(x_ptr, n, BLOCK: tl.constexpr):
        offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        tl.store(x_ptr + offsets, tl.load(x_ptr + offsets, mask=offsets < n) * 2,
                 mask=offsets < n)

    began = time.perf_counter()
    x = torch.arange(1024, device="cuda", dtype=torch.float32)
    double[(4,)](x, 1024, BLOCK=256)
    torch.cuda.synchronize()
    compiled = time.perf_counter()
    a = torch.randn(256, 256, device="cuda")
    reduce_tensor(a @ a)
    torch.cuda.synchronize()
    if float(x.sum()) != 1023 * 1024:
        raise RuntimeError("the kernel's result is wrong")
    return {"triton s": compiled - began, "cublas+ipc s": time.perf_counter() - compiled}


def take(walls: tuple[str, ...], scratch: Path) -> None:
    if "limits" in walls:
        sandbox.apply_limits(sandbox.Limits(cpu_seconds=120, memory_bytes=8 << 30), "cuda")
    if "landlock" in walls:
        sandbox.restrict_writes([scratch, *sandbox.device_paths("cuda")])
    if "seccomp" in walls:
        if "landlock" not in walls:  # seccomp needs no_new_privs, which Landlock sets
            _libc.prctl(sandbox.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
        sandbox.refuse_unix_sockets()


def case(before: tuple[str, ...], after: tuple[str, ...], own_proc: bool) -> dict[str, object]:
    if own_proc:
        sandbox.mount_own_proc()
    scratch = Path(tempfile.mkdtemp())
    os.environ.update(HOME=str(scratch), TMPDIR=str(scratch),
                      TRITON_CACHE_DIR=str(scratch / "triton"))
    tempfile.tempdir = None
    take(before, scratch)
    began = time.perf_counter()
    start_cuda()  # as a spare process starts it
    result: dict[str, object] = {"CUDA start s": time.perf_counter() - began}
    take(after, scratch)
    result.update(work())
    return result


def run_in_child(before: tuple[str, ...], after: tuple[str, ...], own_proc: bool
                 ) -> dict[str, object]:
    own = os.open("/proc/self/ns/pid", os.O_RDONLY)
    read, write = os.pipe()
    if _libc.unshare(ctypes.c_int(sandbox.CLONE_NEWPID)) != 0:
        raise OSError(ctypes.get_errno(), "unshare (PID namespace)")
    pid = os.fork()
    if pid == 0:
        os.close(read)
        try:
            answer = case(before, after, own_proc)
        except Exception as err:  # noqa: BLE001 - the case's outcome is the table's row
            answer = {"error": str(err).splitlines()[0][:160]}
        os.write(write, json.dumps(answer).encode())
        os._exit(0)
    _libc.setns(own, sandbox.CLONE_NEWPID)
    os.close(write)
    text = b""
    while chunk := os.read(read, 65536):
        text += chunk
    os.waitpid(pid, 0)
    return json.loads(text or b'{"error": "the child died"}')


def main() -> None:
    print("| case | CUDA start s | triton s | cublas+ipc s | error |")
    print("| --- | --- | --- | --- | --- |")
    for name, before, after, own_proc in CASES:
        row = run_in_child(before, after, own_proc)
        cells = [f"{row[k]:.2f}" if k in row else "-"
                 for k in ("CUDA start s", "triton s", "cublas+ipc s")]
        print(f"| {name} | {' | '.join(cells)} | {row.get('error', '')} |", flush=True)


if __name__ == "__main__":
    main()
