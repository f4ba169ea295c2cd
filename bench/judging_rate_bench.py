"""Candidates judged per minute: the honest candidates of tests/data/evaluate (pointwise, softmax,
linear + GELU, KernelBench's linear + ReLU), each judged `--rounds` times in one batch after a
warm-up batch, and the CPU milliseconds every process of the evaluation spent per candidate.

    python bench/judging_rate_bench.py [--device cpu|cuda] [--workers 2] [--rounds 20]
        [--root PATH] [--compile-each]

`--root` judges with the Kiln checkout at PATH instead of this one (the candidates and problems
stay this checkout's): run it on an older checkout to compare before and after a change.
`--compile-each` compiles every candidate's kernels anew (Triton's cache unused), as in a search,
where no two candidates are alike; without it a judge that keeps Triton's cache between
candidates compiles each of the four only once.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(HERE))

from bench.processes import descendants, process_table  # noqa: E402

DATA = HERE / "tests" / "data" / "evaluate"
HONEST = {"good_pointwise": "pointwise_problem", "good_softmax": "softmax_problem",
          "good_linear_gelu": "linear_gelu_problem",
          "good_kb_linear_relu": "kb_linear_relu_problem"}
TICK = os.sysconf("SC_CLK_TCK")


def tree_cpu_seconds(root: int) -> float:
    """CPU seconds of `root` and every process below it, those it reaped included."""
    table = process_table()
    return sum(table[pid].cpu_ticks for pid in descendants(root, table) if pid in table) / TICK


def own_cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--root", type=Path, default=HERE, help="the Kiln checkout to judge with")
    parser.add_argument("--compile-each", action="store_true",
                        help="compile every candidate's kernels anew, as a search does")
    args = parser.parse_args()
    if args.compile_each:
        os.environ["TRITON_ALWAYS_COMPILE"] = "1"
    if args.device == "cpu":
        os.environ["TRITON_INTERPRET"] = "1"
    sys.path.insert(0, str(args.root.resolve()))
    from core.evaluate import EvalConfig, Evaluator

    items = [(DATA / f"{problem}.py", (DATA / f"{candidate}.py").read_text())
             for candidate, problem in HONEST.items()] * args.rounds
    with Evaluator(EvalConfig(device=args.device), workers=args.workers) as evaluator:
        evaluator.evaluate_many(items[: args.workers * len(HONEST)])  # workers started, warm
        roots = [worker.process.pid for worker in evaluator.pool.workers]
        before = sum(tree_cpu_seconds(pid) for pid in roots) + own_cpu_seconds()
        began = time.monotonic()
        verdicts = evaluator.evaluate_many(items)
        wall = time.monotonic() - began
        used = sum(tree_cpu_seconds(pid) for pid in roots) + own_cpu_seconds() - before
    correct = sum(v.correct for v in verdicts)
    phases = sorted({name for v in verdicts for name in v.phase_seconds})
    print("median seconds a candidate: " + ", ".join(
        f"{name} {statistics.median(v.phase_seconds.get(name, 0.0) for v in verdicts):.3f}"
        for name in phases))
    for verdict in verdicts:
        if not verdict.correct:
            print(f"not correct: {verdict.reason[:300]}")
            break
    print("| checkout | device | compiles | workers | judged | correct | seconds | per minute "
          "| CPU ms per candidate |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    compiles = "each candidate" if args.compile_each else "cached"
    print(f"| {args.root} | {args.device} | {compiles} | {args.workers} | {len(verdicts)} "
          f"| {correct} "
          f"| {wall:.1f} | {len(verdicts) / wall * 60:.0f} "
          f"| {used / len(verdicts) * 1e3:.0f} |")


if __name__ == "__main__":
    main()
