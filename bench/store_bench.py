"""Store benchmark on the CPU: fill a store with 100,000 candidates, then time what users wait on.

    python -m bench.store_bench [--candidates 100000] [--db PATH]

Targets: a full-text search answers in under 100 ms; storing one candidate with its verdict
takes under 5 ms. Each timed write is its own transaction, committed as the optimizer commits it.
"""

from __future__ import annotations

import argparse
import platform
import random
import sqlite3
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from store import Store, open_reader
from store.reader import RANKED_MATCHES_MAX

SITES_PER_RUN = 20
CANDIDATES_PER_BATCH = 1000
FAMILIES = ("pointwise", "reduction", "matmul", "conv", "attention", "other")
IDEAS = (
    "vectorize loads", "persistent programs", "fuse the epilogue", "split the reduction",
    "more warps", "fewer stages", "swizzle the tile order", "keep the row in registers",
    "online softmax", "cast to fp32 before the sum", "two rows per program", "wider blocks",
)  # fmt: skip
REASONS = (
    ("wrong_values", "max relative error {e:.3g} above the fp32 tolerance 1e-4"),
    ("compile_error", "triton.compiler.errors.CompilationError: at {n}:8: unsupported op"),
    ("", "slower than the baseline ({e:.3g}x)"),
    ("mutated_input", "the candidate changed input {n} in place"),
    ("timeout", "no answer after 120 s"),
)
KERNEL = """import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def {name}_kernel(x_ptr, w_ptr, out_ptr, rows, cols, stride, BLOCK: tl.constexpr):
    row = tl.program_id(0) * {rows_per_program}
    for r in range({rows_per_program}):
        offsets = tl.arange(0, BLOCK)
        mask = offsets < cols
        x = tl.load(x_ptr + (row + r) * stride + offsets, mask=mask, other={other})
        w = tl.load(w_ptr + offsets, mask=mask, other=0.0)
        acc = x.to(tl.float32) * w
        {body}
        tl.store(out_ptr + (row + r) * stride + offsets, acc, mask=mask)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x, w):
        x = x.contiguous()
        out = torch.empty_like(x)
        rows, cols = x.shape
        grid = (triton.cdiv(rows, {rows_per_program}),)
        {name}_kernel[grid](x, w, out, rows, cols, x.stride(0), BLOCK={block},
                            num_warps={warps}, num_stages={stages})
        return out
"""
BODIES = (
    "acc = tl.where(acc > 0, acc, 0.0)",
    "acc = acc - tl.max(acc, axis=0)\n        acc = tl.exp(acc) / tl.sum(tl.exp(acc), axis=0)",
    "acc = acc * tl.sigmoid(acc)",
    "mean = tl.sum(acc, axis=0) / cols\n"
    "        acc = (acc - mean) * tl.rsqrt(tl.sum(acc * acc, axis=0) / cols + 1e-5)",
    "acc = 0.5 * acc * (1.0 + tl.erf(acc * 0.7071067811865476))",
)  # fmt: skip


def kernel_source(rng: random.Random, serial: int) -> str:
    return KERNEL.format(
        name=f"{rng.choice(FAMILIES)}_{serial}",
        rows_per_program=rng.choice((1, 2, 4)),
        other=rng.choice(("0.0", "-float('inf')")),
        body=rng.choice(BODIES),
        block=rng.choice((128, 256, 512, 1024, 2048, 4096)),
        warps=rng.choice((1, 2, 4, 8, 16)),
        stages=rng.choice((1, 2, 3, 4)),
    )


def verdict(rng: random.Random) -> dict:
    latency = rng.uniform(0.01, 2.0)
    code, reason = rng.choice(REASONS)
    accepted = rng.random() < 0.3
    return {
        "compiled": code != "compile_error",
        "correct": code not in ("wrong_values", "compile_error"),
        "accepted": accepted,
        "reason": "" if accepted else reason.format(e=rng.random(), n=rng.randrange(40)),
        "reason_code": "" if accepted else code,
        "max_abs_err": rng.random() * 1e-5,
        "max_rel_err": rng.random() * 1e-5,
        "tolerance": 1e-4,
        "tolerance_name": "fp32",
        "latency_ms": latency,
        "latency_mean_ms": latency * 1.02,
        "latency_min_ms": latency * 0.98,
        "latency_max_ms": latency * 1.3,
        "latency_stdev_ms": latency * 0.02,
        "timing_trials": 100,
        "timing_device": "NVIDIA H200",
        "baseline_ms": 0.5,
        "speedup": 0.5 / latency,
        "library_ops": [],
        "compile_log": "",
    }


def add_one(store: Store, rng: random.Random, site: int, parent: int | None, serial: int) -> int:
    new = store.add_candidate(
        site,
        parent_id=parent,
        tier=rng.choice(("triton", "triton", "cuda")),
        generator=rng.choice(("rules", "llm")),
        rationale=f"{rng.choice(IDEAS)} and {rng.choice(IDEAS)} (variant {serial})",
        source=kernel_source(rng, serial),
    )
    store.add_verdict(new.id, verdict(rng))
    return new.id


def fill(store: Store, total: int, rng: random.Random) -> tuple[list[int], float]:
    per_site = max(1, total // (SITES_PER_RUN * 10))
    sites: list[int] = []
    started = time.perf_counter()
    serial = 0
    while serial < total:
        run = store.start_run(
            model_spec=f"bench/model_{len(sites)}.py", model_hash=f"{rng.getrandbits(32):08x}",
            gpu="NVIDIA H200", versions={"triton": "3.6.0"}, config={},
        )  # fmt: skip
        for index in range(SITES_PER_RUN):
            family = FAMILIES[index % len(FAMILIES)]
            sites.append(
                store.add_site(
                    run, key=f"{family}-{rng.getrandbits(32):08x}", family=family,
                    signature=f"{family}(f32[{rng.randrange(1, 8192)},{rng.randrange(1, 8192)}])",
                    ops=[f"aten.{family}.default", "aten.mul.Tensor"], calls=rng.randrange(1, 50),
                    share=rng.random(), time_ms=1.0, eager_ms=1.0, compile_ms=0.8, floor_ms=0.2,
                    problem_source=f"# problem of a {family} site\n",
                )
            )  # fmt: skip
            parent = None
            for start in range(0, per_site, CANDIDATES_PER_BATCH):
                with store.batch():
                    for _ in range(min(CANDIDATES_PER_BATCH, per_site - start, total - serial)):
                        parent = add_one(store, rng, sites[-1], parent, serial)
                        serial += 1
        store.finish_run(run, e2e={"speedup_vs_eager": 1.2})
    return sites, time.perf_counter() - started


def timed(fn: Callable[[], object], repeats: int) -> list[float]:
    samples = []
    for _ in range(repeats):
        begin = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - begin) * 1e3)
    return samples


def row(name: str, samples: list[float], target_ms: float | None, note: str = "") -> str:
    ordered = sorted(samples)
    p95 = ordered[min(len(ordered) - 1, int(0.95 * len(ordered)))]
    verdict = "-" if target_ms is None else ("yes" if p95 < target_ms else "NO")
    target = "-" if target_ms is None else f"< {target_ms:g}"
    return (
        f"| {name} | {statistics.median(samples):.2f} | {p95:.2f} | {ordered[-1]:.2f} "
        f"| {target} | {verdict} | {note} |"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--candidates", type=int, default=100_000)
    parser.add_argument("--db", type=Path, help="store to fill (default: a temporary file)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    folder = tempfile.TemporaryDirectory()
    path = args.db or Path(folder.name) / "bench.db"

    with Store.open(path) as store:
        sites, fill_s = fill(store, args.candidates, rng)
    size_mb = path.stat().st_size / 2**20
    print(
        f"filled {args.candidates} candidates with verdicts in {fill_s:.1f} s ({size_mb:.0f} MiB,"
        f" Python {platform.python_version()}, SQLite {sqlite3.sqlite_version})"
    )

    print("\n| operation | median ms | p95 ms | max ms | target ms | p95 meets it | note |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    with Store.open(path) as store:
        run = store.start_run(
            model_spec="bench/live.py", model_hash="0", gpu="NVIDIA H200", versions={}, config={}
        )
        site = store.add_site(
            run, key="pointwise-live", family="pointwise", signature="relu(f32[4096,4096])",
            ops=["aten.relu.default"], calls=1, share=0.5, time_ms=1.0, eager_ms=1.0,
            compile_ms=0.8, floor_ms=0.2, problem_source="# problem\n",
        )  # fmt: skip
        serial = iter(range(args.candidates, args.candidates + 10_000))
        parents: list[int | None] = [None]

        def store_one() -> None:
            parents.append(add_one(store, rng, site, parents[-1], next(serial)))

        def store_one_batched() -> None:
            with store.batch():
                store_one()

        two_commits = timed(store_one, 300)
        print(row("store a candidate, then its verdict (2 commits)", two_commits, 5.0))
        one_commit = timed(store_one_batched, 300)
        print(row("store a candidate with its verdict (1 commit)", one_commit, 5.0))

    searches = {
        "rare word (a unique variant number)": ("variant 4242", False, None),
        "word in about 1 in 7 (a rejection reason)": ("mutated_input", False, None),
        "words in about 1 in 6 (a rationale idea)": ("online softmax", False, None),
        "FTS syntax, OR of two ideas": ('"persistent programs" OR "swizzle"', True, None),
        "FTS syntax, prefix in one column": ("reason:compil*", True, None),
        "word in every candidate (tl.load)": ("tl.load", False, None),
        "word in every candidate, one run": ("tl.load", False, 3),
    }
    with open_reader(path) as reader:
        for name, (query, fts, run_id) in searches.items():
            match = query if fts else reader.db.quote_fts(query)
            (matches,) = reader.db.execute(
                "SELECT count(*) FROM candidate_fts JOIN candidates c ON c.id = candidate_fts.rowid"
                " JOIN sites s ON s.id = c.site_id"
                " WHERE candidate_fts MATCH :match AND (:run IS NULL OR s.run_id = :run)",
                {"match": match, "run": run_id},
            ).fetchone()
            order = "ranked" if matches <= RANKED_MATCHES_MAX else "newest first"
            scope = "in the store" if run_id is None else f"in run {run_id}"
            samples = timed(
                lambda q=query, f=fts, r=run_id: reader.search(q, fts_syntax=f, run_id=r), 20
            )
            print(row(f"search: {name}", samples, 100.0, f"{matches} match {scope}; {order}"))
        one_run = reader.latest_run_id() - 1
        print(row("best kernels of one run", timed(lambda: reader.best(one_run), 20), None))
        of_site = timed(lambda: reader.candidates(site_id=sites[0]), 20)
        print(row("candidates of one site", of_site, None))
        print(row("runs with their counts", timed(reader.runs, 5), None))
    folder.cleanup()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
