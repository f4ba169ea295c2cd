"""The evaluator at real sizes: KernelBench problems optimized a few at a time on one GPU.

    python -m bench.evaluator_scale_bench PROBLEM [PROBLEM ...] [--parallel 3] [--budget 3]
                                          [--out DIR] [-- extra core.optimize arguments]

Each problem is optimized by `python -m core.optimize` in its own process and store, `--parallel`
of them at once (the evaluator's device memory budgets and the device lock keep them from
disturbing each other). Per problem the table gives whether the run ended cleanly, the candidates
judged and judged per minute of search, the median seconds a candidate spent in each phase, and
the peak device memory of a judged candidate over its site problem's input and output bytes.
The table is printed and written to `DIR/evaluator_scale.md`; each run's log and JSON report are
kept in `DIR/<problem>/`.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from core.evaluate.memory import problem_bytes  # noqa: E402
from store import open_reader  # noqa: E402

PHASES = ("worker start", "waiting for memory", "compile", "checks", "timing", "counters")


@dataclass
class Row:
    name: str
    status: str
    judged: int = 0
    per_minute: float = 0.0
    phases: dict[str, float] = field(default_factory=dict)
    memory_ratio: float | None = None  # peak device memory over the site's io bytes, worst site
    io_gb: float = 0.0
    minutes: float = 0.0


def _time(stamp: str) -> float:
    return datetime.fromisoformat(stamp).timestamp()


def measure(problem: Path, args: argparse.Namespace, extra: list[str]) -> Row:
    out = args.out / problem.stem
    out.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, "-m", "core.optimize", str(problem), "--device", "cuda",
               "--budget", str(args.budget), "--json", "--db", str(out / "kiln.db"),
               "--out", str(out), *extra]
    began = time.perf_counter()
    result = subprocess.run(command, capture_output=True, text=True)
    minutes = (time.perf_counter() - began) / 60
    (out / "optimize.log").write_text(result.stderr)
    (out / "report.json").write_text(result.stdout)
    status = "ok" if result.returncode == 0 else f"exit {result.returncode}: " + (
        result.stderr.strip().splitlines() or ["no output"])[-1][:100]
    row = Row(problem.stem, status, minutes=minutes)
    if not (out / "kiln.db").exists():
        return row
    with open_reader(out / "kiln.db") as reader:
        run_id = reader.latest_run_id()
        candidates = [reader.candidate(c.id) for s in reader.sites(run_id)
                      for c in reader.candidates(site_id=s.id)]
        verdicts = [c.verdict for c in candidates if c.verdict]
        stamps = sorted(_time(c.summary.created_at) for c in candidates)
        row.judged = len(verdicts)
        if len(stamps) > 1 and stamps[-1] > stamps[0]:
            row.per_minute = (len(stamps) - 1) / ((stamps[-1] - stamps[0]) / 60)
        row.phases = {p: statistics.median(v.get("phase_seconds", {}).get(p, 0.0)
                                           for v in verdicts)
                      for p in PHASES} if verdicts else {}
        ratios = []
        for site in reader.sites(run_id):
            peaks = [c.verdict.get("peak_memory_bytes") for c in candidates
                     if c.summary.site_id == site.id and c.verdict]
            peaks = [p for p in peaks if p]
            if not peaks:
                continue
            path = out / "site_problems" / f"{site.key}.py"
            path.parent.mkdir(exist_ok=True)
            path.write_text(site.problem_source)
            size = problem_bytes(path)
            io_bytes = size.inputs + size.outputs
            row.io_gb = max(row.io_gb, io_bytes / 1e9)
            ratios.append(max(peaks) / io_bytes)
        row.memory_ratio = max(ratios) if ratios else None
    return row


def table(rows: list[Row]) -> str:
    header = ("| problem | status | judged | per minute | site io GB | peak / io | "
              + " | ".join(f"{p} s" for p in PHASES) + " | minutes |")
    lines = [header, "|" + " --- |" * (header.count("|") - 1)]
    for r in rows:
        ratio = "-" if r.memory_ratio is None else f"{r.memory_ratio:.2f}"
        phases = " | ".join(f"{r.phases.get(p, 0.0):.2f}" for p in PHASES)
        lines.append(f"| {r.name} | {r.status} | {r.judged} | {r.per_minute:.1f} | "
                     f"{r.io_gb:.2f} | {ratio} | {phases} | {r.minutes:.1f} |")
    return "\n".join(lines)


def main() -> int:
    argv = sys.argv[1:]
    extra = argv[argv.index("--") + 1:] if "--" in argv else []
    argv = argv[: argv.index("--")] if "--" in argv else argv
    parser = argparse.ArgumentParser(prog="python -m bench.evaluator_scale_bench",
                                     description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("problems", nargs="+", type=Path)
    parser.add_argument("--parallel", type=int, default=3)
    parser.add_argument("--budget", type=float, default=3.0, help="minutes per problem")
    parser.add_argument("--out", type=Path, default=Path("kiln-out/evaluator-scale"))
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    with ThreadPoolExecutor(args.parallel) as pool:
        rows = list(pool.map(lambda p: measure(p, args, extra), args.problems))
    text = table(rows)
    (args.out / "evaluator_scale.md").write_text(text + "\n")
    print(text)
    return 0 if all(r.status == "ok" for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
