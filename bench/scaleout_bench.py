"""Evaluation throughput on one GPU against every visible GPU, local executor. Prints one table.

    python bench/scaleout_bench.py [--workers-per-gpu 2] [--candidates 40]

Each configuration judges its own distinct Triton softmax kernels (the problem and candidates
of bench/evaluate_bench.py's pool section), so neither finds the other's kernels compiled in
Triton's cache. Workers are started and warmed before the clock starts.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.evaluate_bench import SOFTMAX_CANDIDATE, SOFTMAX_SITE, table  # noqa: E402
from core.evaluate import EvalConfig, Evaluator  # noqa: E402


def candidates(first: int, count: int) -> list[str]:
    return [SOFTMAX_CANDIDATE.replace("VARIANT", f"{i}.0").replace("WARPS", str(4 << (i % 3)))
            for i in range(first, first + count)]


def measure(problem: Path, gpus: tuple[int, ...], workers: int, sources: list[str],
            warm_source: str) -> tuple[int, float]:
    """(accepted, seconds) for judging `sources` on `workers` workers over `gpus`."""
    with Evaluator(EvalConfig(device="cuda", gpus=gpus), workers=workers) as evaluator:
        evaluator.evaluate_many([(problem, warm_source)] * workers)
        began = time.monotonic()
        verdicts = evaluator.evaluate_many([(problem, s) for s in sources])
        elapsed = time.monotonic() - began
    return sum(v.accepted for v in verdicts), elapsed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workers-per-gpu", type=int, default=2)
    parser.add_argument("--candidates", type=int, default=40)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("this benchmark needs a CUDA GPU", file=sys.stderr)
        return 2
    count = torch.cuda.device_count()
    print(f"# Scale-out benchmark: {count} x {torch.cuda.get_device_name()}, "
          f"torch {torch.__version__}")
    configurations = [("1 GPU", (0,))]
    if count > 1:
        configurations.append((f"{count} GPUs", tuple(range(count))))
    rows, per_minute = [], []
    with tempfile.TemporaryDirectory(prefix="kiln-bench-") as folder:
        problem = Path(folder) / "softmax_site.py"
        problem.write_text(SOFTMAX_SITE)
        for offset, (label, gpus) in enumerate(configurations):
            workers = args.workers_per_gpu * len(gpus)
            first = (offset + 1) * 10_000  # distinct kernels per configuration
            sources = candidates(first, args.candidates)
            accepted, seconds = measure(problem, gpus, workers, sources,
                                        candidates(first - 1, 1)[0])
            per_minute.append(args.candidates / seconds * 60)
            rows.append([label, str(workers), str(args.candidates), str(accepted),
                         f"{seconds:.1f}", f"{per_minute[-1]:.0f}",
                         f"{per_minute[-1] / per_minute[0]:.2f}x"])
    table("Evaluation throughput, softmax 128x16384 site, distinct Triton kernels, local "
          "executor", ["GPUs", "workers", "candidates", "accepted", "seconds", "per minute",
                       "vs 1 GPU"], rows)
    if count == 1:
        print("\nonly one GPU is visible: nothing to compare it with")
    return 0


if __name__ == "__main__":
    sys.exit(main())
