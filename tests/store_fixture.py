"""A small real store for the store's tests: one run, two sites, a tree of real candidates.

The pointwise site's problem is a real KernelBench problem and its candidates are real Triton
kernels that run under TRITON_INTERPRET=1; the verdicts are shaped as the evaluator gives them.
"""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path

from core.evaluate.verdict import Reason, Verdict
from store import Store

POINTWISE_PROBLEM = """import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x, y):
        return torch.relu(x + y) * 0.5


def get_inputs():
    return [torch.randn(37, 129), torch.randn(37, 129)]


def get_init_inputs():
    return []
"""

TRITON_TEMPLATE = """import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def add_relu_half_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    x = tl.load(x_ptr + offsets, mask=mask)
    y = tl.load(y_ptr + offsets, mask=mask)
    tl.store(out_ptr + offsets, tl.maximum(x + y, 0.0) * 0.5, mask=mask)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x, y):
        x, y = x.contiguous(), y.contiguous()
        out = torch.empty_like(x)
        n = x.numel()
        add_relu_half_kernel[(triton.cdiv(n, BLOCK_SIZE),)](x, y, out, n, BLOCK=BLOCK_SIZE)
        return out


BLOCK_SIZE = {block}
"""

REDUCTION_PROBLEM = """import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return torch.softmax(x, dim=-1)


def get_inputs():
    return [torch.randn(16, 1000)]


def get_init_inputs():
    return []
"""

BROKEN_SOFTMAX = """import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def softmax_kernel(x_ptr, out_ptr, cols, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    offsets = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + row * cols + offsets, mask=offsets < cols, other=-float("inf"))
    e = tl.exp(x - tl.max(x, axis=0))
    tl.store(out_ptr + row * cols + offsets, e / tl.summ(e, axis=0), mask=offsets < cols)


class ModelNew(nn.Module):
    def forward(self, x):
        out = torch.empty_like(x)
        softmax_kernel[(x.shape[0],)](x, out, x.shape[1], BLOCK=1024)
        return out
"""


def triton_candidate(block: int) -> str:
    return TRITON_TEMPLATE.format(block=block)


def verdict(
    *,
    accepted: bool,
    latency_ms: float | None,
    baseline_ms: float = 1.0,
    code: Reason = Reason.ACCEPTED,
    reason: str = "",
    compiled: bool = True,
    correct: bool = True,
) -> Verdict:
    """A verdict as the evaluator gives it after timing on the GPU."""
    timed = latency_ms is not None
    return Verdict(
        compiled=compiled,
        correct=correct,
        accepted=accepted,
        reason=reason,
        reason_code=code,
        tier="triton",
        max_abs_err=3e-7 if correct else 0.25,
        max_rel_err=1e-6 if correct else 0.5,
        tolerance=1e-4,
        tolerance_name="fp32",
        trials_checked=["seed 0", "seed 1", "captured"],
        latency_ms=latency_ms,
        latency_mean_ms=latency_ms * 1.02 if timed else None,
        latency_min_ms=latency_ms * 0.97 if timed else None,
        latency_max_ms=latency_ms * 1.2 if timed else None,
        latency_stdev_ms=latency_ms * 0.03 if timed else None,
        timing_trials=50 if timed else 0,
        baseline_ms=baseline_ms,
        speedup=baseline_ms / latency_ms if timed else None,
        timing_device="NVIDIA H200" if timed else "",
        kernel_launches=1 if compiled else 0,
        compile_log="" if compiled else "AttributeError: module has no attribute 'summ'",
    )


@dataclass(frozen=True)
class Filled:
    """Ids in the filled store, named after their role."""

    path: Path
    run: int
    pointwise: int
    reduction: int
    draft: int  # accepted, 0.8 ms
    faster: int  # child of draft, accepted, 0.5 ms: the site's best
    mismatch: int  # child of draft, wrong values
    pending: int  # child of faster, no verdict yet
    broken: int  # the reduction site's only candidate: does not compile
    llm_call: int


def fill_store(path: Path) -> Filled:
    with Store.open(path) as store:
        run = store.start_run(
            model_spec="examples/block.py",
            model_hash="9f2c41aa",
            gpu="NVIDIA H200",
            versions={"torch": "2.11.0", "triton": "3.6.0", "cuda": "13.0"},
            config={"budget": 64, "tiers": ["triton", "cuda"]},
        )
        pointwise = store.add_site(
            run,
            key="pointwise-1a2b3c4d",
            family="pointwise",
            signature="relu(add(f32[37,129], f32[37,129])) * 0.5",
            ops=["aten.add.Tensor", "aten.relu.default", "aten.mul.Tensor"],
            calls=12,
            share=0.4,
            time_ms=1.1,
            eager_ms=1.0,
            compile_ms=0.9,
            floor_ms=0.3,
            problem_source=POINTWISE_PROBLEM,
        )
        reduction = store.add_site(
            run,
            key="reduction-5e6f7a8b",
            family="reduction",
            signature="softmax(f32[16,1000], dim=-1)",
            ops=["aten._softmax.default"],
            calls=2,
            share=0.1,
            time_ms=0.2,
            eager_ms=0.2,
            compile_ms=0.25,
            floor_ms=0.05,
            problem_source=REDUCTION_PROBLEM,
        )
        draft = store.add_candidate(
            pointwise,
            parent_id=None,
            tier="triton",
            generator="rules",
            rationale="fuse add, relu and scale into one pass",
            source=triton_candidate(1024),
        ).id
        store.add_verdict(draft, verdict(accepted=True, latency_ms=0.8))
        faster = store.add_candidate(
            pointwise,
            parent_id=draft,
            tier="triton",
            generator="rules",
            rationale="smaller blocks for more programs in flight",
            source=triton_candidate(256),
        ).id
        store.add_verdict(faster, verdict(accepted=True, latency_ms=0.5))
        mismatch = store.add_candidate(
            pointwise,
            parent_id=draft,
            tier="triton",
            generator="rules",
            rationale="drop the mask on the tail block",
            source=triton_candidate(1024).replace(", mask=mask)", ")"),
        ).id
        store.add_verdict(
            mismatch,
            verdict(
                accepted=False,
                latency_ms=0.45,
                correct=False,
                code=Reason.WRONG_VALUES,
                reason="max relative error 0.5 above the fp32 tolerance 1e-4 at [36, 128]",
            ),
        )
        pending = store.add_candidate(
            pointwise,
            parent_id=faster,
            tier="triton",
            generator="rules",
            rationale="try 128-wide blocks",
            source=triton_candidate(128),
        ).id
        llm_call = store.add_llm_call(
            run,
            site_id=reduction,
            model="gpt-4.1",
            prompt="Write a Triton softmax for f32[16,1000].",
            reply=f"```python\n{BROKEN_SOFTMAX}```",
            prompt_tokens=812,
            completion_tokens=344,
            latency_ms=2150.0,
            cost_usd=0.0043,
        )
        broken = store.add_candidate(
            reduction,
            parent_id=None,
            tier="triton",
            generator="llm",
            rationale="one program per row, whole row in registers",
            source=BROKEN_SOFTMAX,
            llm_call_id=llm_call,
        ).id
        store.add_verdict(
            broken,
            verdict(
                accepted=False,
                latency_ms=None,
                compiled=False,
                correct=False,
                code=Reason.COMPILE_ERROR,
                reason="module 'triton.language' has no attribute 'summ'",
            ),
        )
    return Filled(
        path, run, pointwise, reduction, draft, faster, mismatch, pending, broken, llm_call
    )


# A rationale and a reason as a hostile generator or kernel could write them: Markdown and HTML
# that would make a browser fetch an image if the app rendered them.
HOSTILE_RATIONALE = "fast ![x](http://example.invalid/a.png) <img src=http://example.invalid/b.png>"
HOSTILE_REASON = "boom ![y](http://example.invalid/c.png) <img src='http://example.invalid/d.png'>"
PHASE_SECONDS = {"worker start": 0.8, "waiting for memory": 0.05, "candidate start": 0.3,
                 "compile": 2.5, "checks": 1.2, "timing": 0.9, "counters": 3.1, "ending": 0.1,
                 "waiting for the device": 0.4}


@dataclass(frozen=True)
class Kinds:
    """A store holding one candidate of each verdict label; the candidates by label."""

    path: Path
    gpu_run: int
    cpu_run: int
    labels: dict[int, str]  # candidate id -> the label its verdict must read as
    accepted: int  # timed on a GPU, with phase seconds and peak memory
    slower: int  # correct, reason code "slower"
    legacy_slower: int  # an accepted flag from before accepted meant faster, at 0.5x
    cpu_kernel: int  # of the CPU run: accepted, 2x on the CPU


def _timed(v: Verdict, peak_memory_bytes: int | None = None) -> Verdict:
    return replace(v, phase_seconds=dict(PHASE_SECONDS), eval_seconds=sum(PHASE_SECONDS.values()),
                   peak_memory_bytes=peak_memory_bytes)


def fill_verdict_kinds(path: Path) -> Kinds:
    """A GPU run with one candidate of each label, and a CPU run headlining a 47x speedup."""
    with Store.open(path) as store:
        gpu_run = store.start_run(model_spec="examples/block.py", model_hash="1", gpu="NVIDIA H200",
                                  versions={}, config={})
        site = store.add_site(
            gpu_run, key="pointwise-1a2b3c4d", family="pointwise", signature="relu(x + y) * 0.5",
            ops=["aten.add.Tensor"], calls=1, share=0.5, time_ms=1.0, eager_ms=1.0,
            compile_ms=None, floor_ms=0.1, problem_source=POINTWISE_PROBLEM)
        kinds = [
            ("accepted", _timed(verdict(accepted=True, latency_ms=0.5), 3 * 2**30)),
            ("correct, slower", _timed(verdict(
                accepted=False, latency_ms=1.25, code=Reason.SLOWER,
                reason="correct, but 0.80x the speed of the PyTorch reference"))),
            # Faster in ms than the accepted one, against a faster baseline: 0.5x its reference.
            ("correct, slower", verdict(accepted=True, latency_ms=0.4, baseline_ms=0.2)),
            ("rejected", verdict(accepted=False, latency_ms=0.9,
                                 code=Reason.SPEEDUP_NOT_REPRODUCED, reason=HOSTILE_REASON)),
            ("incorrect", verdict(accepted=False, latency_ms=0.45, correct=False,
                                  code=Reason.WRONG_VALUES, reason="max relative error 0.5")),
            ("compile failed", replace(verdict(
                accepted=False, latency_ms=None, compiled=False, correct=False,
                code=Reason.COMPILE_ERROR, reason="no attribute 'summ'"),
                compile_log=f"Traceback: {HOSTILE_REASON}")),
            ("pending", None),
        ]
        labels = {}
        for block, (label, judged) in enumerate(kinds):
            candidate = store.add_candidate(
                site, parent_id=None, tier="triton", generator="llm",
                rationale=HOSTILE_RATIONALE if label == "rejected" else f"a {label} kernel",
                source=triton_candidate(2 ** (block + 5))).id
            if judged is not None:
                store.add_verdict(candidate, judged)
            labels[candidate] = label
        store.finish_run(gpu_run, e2e={"speedup_vs_eager": 1.8, "speedup_vs_compile": 1.2,
                                       "optimized_ms": 2.0, "floor_ms": 1.5})
        cpu_run = store.start_run(model_spec="examples/block.py", model_hash="1", gpu="cpu",
                                  versions={}, config={"device": "cpu"})
        cpu_site = store.add_site(
            cpu_run, key="pointwise-1a2b3c4d", family="pointwise", signature="relu(x + y) * 0.5",
            ops=["aten.add.Tensor"], calls=1, share=0.5, time_ms=1.0, eager_ms=1.0,
            compile_ms=None, floor_ms=0.1, problem_source=POINTWISE_PROBLEM)
        cpu_kernel = store.add_candidate(
            cpu_site, parent_id=None, tier="triton", generator="rules", rationale="on the CPU",
            source=triton_candidate(64)).id
        store.add_verdict(cpu_kernel, verdict(accepted=True, latency_ms=0.5))
        labels[cpu_kernel] = "accepted"
        store.finish_run(cpu_run, e2e={"speedup_vs_eager": 47.0, "speedup_vs_compile": 3.0,
                                       "optimized_ms": 2.0, "floor_ms": 1.0})
    ids = list(labels)
    return Kinds(path, gpu_run, cpu_run, labels, ids[0], ids[1], ids[2], cpu_kernel)


REPO = Path(__file__).resolve().parents[1]


def run_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """`python -m store ARGS` in a fresh process, from the repository root."""
    return subprocess.run(
        [sys.executable, "-m", "store", *args],
        cwd=REPO,
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=120,
    )


def _index_entries(conn: sqlite3.Connection) -> list[tuple]:
    conn.execute(
        "CREATE VIRTUAL TABLE IF NOT EXISTS temp.index_vocab"
        " USING fts5vocab(main, 'candidate_fts', 'instance')"
    )
    return conn.execute(
        "SELECT term, doc, col, offset FROM temp.index_vocab ORDER BY 1, 2, 3, 4"
    ).fetchall()


def assert_search_index_matches_records(path: Path) -> None:
    """The full-text index holds exactly what a rebuild from the records would give."""
    copy = sqlite3.connect(":memory:")
    with sqlite3.connect(path) as source:
        source.backup(copy)
    stored = _index_entries(copy)
    copy.execute("INSERT INTO candidate_fts (candidate_fts) VALUES ('rebuild')")
    rebuilt = _index_entries(copy)
    missing, extra = set(rebuilt) - set(stored), set(stored) - set(rebuilt)
    assert not missing and not extra, (
        f"index differs from the records: {len(missing)} entries missing (e.g."
        f" {sorted(missing)[:3]}), {len(extra)} stale (e.g. {sorted(extra)[:3]})"
    )


@contextmanager
def read_only(*paths: Path) -> Iterator[None]:
    """Make files and folders read-only for this process, root included, for the block."""
    if os.geteuid() == 0:
        # Root ignores permission bits; the immutable attribute stops it too.
        subprocess.run(["chattr", "+i", *map(str, paths)], check=True)
        try:
            yield
        finally:
            subprocess.run(["chattr", "-i", *map(str, paths)], check=True)
        return
    modes = [path.stat().st_mode for path in paths]
    for path, mode in zip(paths, modes, strict=True):
        path.chmod(mode & ~0o222)
    try:
        yield
    finally:
        for path, mode in zip(paths, modes, strict=True):
            path.chmod(mode)
