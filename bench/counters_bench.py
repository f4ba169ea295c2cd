"""Hardware counters of the best rules kernel for a pointwise, a reduction and a matmul site,
and how long Nsight Compute took to collect them. Prints one table.

    python bench/counters_bench.py [--workers 4] [--children 3] [--save-csv DIR]

Each site gets the rules generator's drafts and one round of children, judged on the GPU; the
fastest accepted kernel is profiled by `core.evaluate.counters.collect` (ncu, --clock-control none)
and diagnosed with and without its counters. `--save-csv` keeps ncu's raw output per site.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from rules_generator_bench import CASES, drafts_and_children, problem_source  # noqa: E402

from core.evaluate import EvalConfig, Evaluator  # noqa: E402
from core.evaluate.counters import collect  # noqa: E402
from core.evaluate.diagnosis import diagnose  # noqa: E402
from core.evaluate.kernel_report import KernelReport  # noqa: E402
from core.profile.roofline import GpuPeaks  # noqa: E402
from core.timing.device_lock import device_lock_path  # noqa: E402
from generators.rules import RulesGenerator  # noqa: E402

SITES = {"pointwise": "bias + gelu", "reduction": "softmax 8192", "matmul": "linear + gelu"}
TIMEOUT_S = 120.0
PEAKS = GpuPeaks()


def fmt(value: float | None, unit: str = "%") -> str:
    return "-" if value is None else f"{value:.0f}{unit}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--children", type=int, default=3)
    parser.add_argument("--save-csv", type=Path)
    args = parser.parse_args()
    generator = RulesGenerator()
    rows = []
    with tempfile.TemporaryDirectory(prefix="kiln-counters-bench-") as folder, \
            Evaluator(EvalConfig(device="cuda"), workers=args.workers) as evaluator:
        for family, name in SITES.items():
            case = next(c for c in CASES if c.name.startswith(name))
            problem = Path(folder) / family / "problem.py"
            problem.parent.mkdir()
            problem.write_text(problem_source(case))
            proposals = drafts_and_children(generator, problem, ("triton",), args.children)
            verdicts = evaluator.evaluate_many([(problem, p.source) for p in proposals])
            accepted = [(v, p) for v, p in zip(verdicts, proposals, strict=True) if v.accepted]
            if not accepted:
                print(f"{case.name}: nothing accepted of {len(proposals)}", flush=True)
                continue
            verdict, best = min(accepted, key=lambda pair: pair[0].latency_ms)
            candidate = Path(folder) / family / "candidate.py"
            candidate.write_text(best.source)
            saved = args.save_csv / f"{family}.csv" if args.save_csv else None
            if saved is not None:
                saved.parent.mkdir(parents=True, exist_ok=True)
            report = collect(problem, candidate, seed=0, timeout_s=TIMEOUT_S,
                             lock_path=device_lock_path("cuda"), save_output=saved)
            static = KernelReport.from_dict(verdict.kernel_report or {})
            floor = max(case.bytes / PEAKS.bandwidth,
                        case.flops / PEAKS.matrix_flops["bf16"]) * 1e3
            with_counters = diagnose(static, verdict.latency_ms, floor, verdict.baseline_ms,
                                     counters=report)
            print(f"{case.name}: best {verdict.latency_ms:.4f} ms ({best.rationale[:60]}); "
                  f"counters in {report.seconds:.1f} s; notes: {report.notes}", flush=True)
            kernel = report.dominant
            if kernel is None:
                rows.append(f"| {case.name} | {verdict.latency_ms:.4f} | - | - | - | - | - | - "
                            f"| {report.seconds:.1f} | no counters | {verdict.diagnosis} |")
                continue
            stalls = ", ".join(f"{r} {share:.0%}" for r, share in kernel.top_stalls(3))
            rows.append(
                f"| {case.name} | {verdict.latency_ms:.4f} | {fmt(kernel.dram_pct)} "
                f"| {fmt(kernel.sm_pct)} | {fmt(kernel.achieved_occupancy_pct)} "
                f"| {fmt(kernel.l2_hit_pct)} | {fmt(kernel.sector_use_pct)} | {stalls} "
                f"| {report.seconds:.1f} | {with_counters} | {verdict.diagnosis} |")
    print("\n| site | best ms | DRAM % peak | SM % peak | achieved occupancy | L2 hit "
          "| sector use | top stalls | ncu s | diagnosis with counters | without |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    print("\n".join(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
