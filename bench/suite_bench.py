"""Kiln's benchmark suite on a GPU: each entry optimized end to end, one results table.

    python -m bench.suite_bench [--set suite|dev] [--budget 10] [--only name,name]
                                [--skip name,name] [--parallel N] [--out DIR]
                                [-- extra core.optimize arguments]

Each entry of `bench/suite.py` (`--set dev`: of the development set, KernelBench problems as
written) is optimized by `python -m core.optimize` in its own process
and store (rules generator, fixed budget). `--parallel N` runs N entries at once: every
timing of every Kiln process holds the GPU alone through its device lock, so entries sharing
a GPU share its idle time (compiles, checks), not their measurements. They do share the
CPU: a model whose speed depends on how fast Python launches its kernels times slower beside
other runs, so run whole models with `--parallel 1` for figures to keep.

The table gives, per entry: whether the installed model passed the end-to-end check, its time
(each the median of the end-to-end check's rounds timed in turns, with the widest range of one
model's rounds) against eager, against torch.compile and against the faster of the two,
the model's floor (its sites' roofline floors summed, on the GPU the run's floors are
against) with the faster baseline over it (the most any kernels could give), Amdahl's
prediction, the time spent, the candidates tried and the tiers of the installed kernels; then
the geometric means over the suite. The table is printed and written to `DIR/suite.md` as each
entry finishes, so an interrupted run keeps what it measured; each entry's JSON report and
log are kept beside it, in `DIR/<entry>/`.
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.suite import SETS, SuiteEntry, entry  # noqa: E402
from core.runtime.errors import exit_on_input_error  # noqa: E402


@dataclass(frozen=True)
class Outcome:
    name: str
    dtype: str
    correct: bool | None  # None: the run failed
    eager_ms: float
    compile_ms: float
    optimized_ms: float
    predicted: float
    minutes: float
    tried: int
    tiers: str
    note: str
    spread_ms: float = math.nan  # the widest range of one model's end-to-end rounds
    floor_ms: float = math.nan  # the roofline floors of the model's sites, summed

    @property
    def vs_best(self) -> float:
        return min(self.eager_ms, self.compile_ms) / self.optimized_ms

    @property
    def headroom(self) -> float:
        """The faster baseline over the model's floor: the most any kernels could give."""
        return min(self.eager_ms, self.compile_ms) / self.floor_ms


def command(item: SuiteEntry, args: argparse.Namespace, extra: list[str]) -> list[str]:
    out = args.out / item.name
    line = [sys.executable, "-m", "core.optimize", item.model, "--device", "cuda", "--dtype",
            item.dtype, "--budget", str(args.budget), "--generator", "rules", "--json",
            "--db", str(out / "kiln.db"), "--out", str(out), *extra]
    if item.shape is not None:
        line += ["--batch", str(item.shape.batch), "--seq-len", str(item.shape.seq_len),
                 "--image-size", str(item.shape.image_size)]
    return line


def optimize(item: SuiteEntry, args: argparse.Namespace, extra: list[str]) -> Outcome:
    (args.out / item.name).mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    result = subprocess.run(command(item, args, extra), capture_output=True, text=True)
    minutes = (time.perf_counter() - started) / 60
    (args.out / item.name / "optimize.log").write_text(result.stderr)
    if result.returncode != 0:
        return failed_outcome(item.name, item.dtype, minutes, result.returncode, result.stderr)
    (args.out / item.name / "report.json").write_text(result.stdout)
    return outcome_of(item.name, item.dtype, json.loads(result.stdout), minutes)


def failed_outcome(name: str, dtype: str, minutes: float, returncode: int,
                   stderr: str) -> Outcome:
    """The row of a run that exited with `returncode`: its last line of stderr says why."""
    last = stderr.strip().splitlines()[-1:] or ["no output"]
    return Outcome(name, dtype, None, math.nan, math.nan, math.nan, math.nan, minutes, 0, "-",
                   f"failed ({returncode}): {last[0][:120]}")


def outcome_of(name: str, dtype: str, report: dict, minutes: float) -> Outcome:
    """One row of the table, for the entry `name`, from an optimize run's JSON report."""
    e2e = report["e2e"]
    tried = sum(s["evaluations"] for s in report["searched"])
    floor_ms = report.get("floor_ms") or math.nan
    if not e2e or e2e.get("error"):
        why = (e2e or {}).get("error") or report.get("failure") or "no end-to-end check"
        return Outcome(name, dtype, None, math.nan, math.nan, math.nan, math.nan,
                       minutes, tried, "-", f"end to end not done: {why[:120]}",
                       floor_ms=floor_ms)
    best = {s["id"]: s["best"]["tier"] for s in report["searched"]}
    tiers = ", ".join(sorted({best[key] for key in e2e["installed"] if key in best})) or "torch"
    note = "; ".join(f"{key} out: {why[:80]}" for key, why in e2e["removed"].items())
    if not e2e["correct"]:
        note = f"{e2e['reason'][:160]}; {note}"
    return Outcome(name, dtype, e2e["correct"], e2e["eager_ms"], e2e["compile_ms"],
                   e2e["optimized_ms"], e2e["predicted_speedup"], minutes, tried, tiers, note,
                   e2e.get("spread_ms", math.nan), floor_ms)


def geomean(values: list[float]) -> float:
    values = [v for v in values if math.isfinite(v) and v > 0]
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else math.nan


def table(outcomes: list[Outcome]) -> str:
    lines = ["| entry | dtype | e2e check | eager ms | compile ms | Kiln ms | spread ms "
             "| vs eager | vs compile | vs faster | floor ms | faster / floor "
             "| predicted vs eager | minutes | tried | installed tiers | note |",
             "|" + " --- |" * 17]
    for o in outcomes:
        check = {True: "correct", False: "WRONG", None: "failed"}[o.correct]
        lines.append(
            f"| {o.name} | {o.dtype} | {check} | {o.eager_ms:.4f} | {o.compile_ms:.4f} "
            f"| {o.optimized_ms:.4f} | {o.spread_ms:.4f} | {o.eager_ms / o.optimized_ms:.2f}x "
            f"| {o.compile_ms / o.optimized_ms:.2f}x | {o.vs_best:.2f}x | {o.floor_ms:.4f} "
            f"| {o.headroom:.2f}x | {o.predicted:.2f}x "
            f"| {o.minutes:.1f} | {o.tried} | {o.tiers} | {o.note} |")
    done = [o for o in outcomes if o.correct is not None]
    lines += ["", f"Geometric mean over {len(done)} entries: "
              f"{geomean([o.eager_ms / o.optimized_ms for o in done]):.3f}x vs eager, "
              f"{geomean([o.compile_ms / o.optimized_ms for o in done]):.3f}x vs torch.compile, "
              f"{geomean([o.vs_best for o in done]):.3f}x vs the faster of the two; the "
              f"faster over the floor {geomean([o.headroom for o in done]):.3f}x (the most "
              "any kernels could give)."]
    return "\n".join(lines)


def selected(only: str, skip: str, among: str = "suite") -> list[SuiteEntry]:
    """The entries named in `only` (comma-separated; all of the set `among` if empty), less
    those in `skip`."""
    items = [entry(name) for name in only.split(",")] if only else SETS[among]
    skipped = {entry(name).name for name in skip.split(",") if name}
    return [item for item in items if item.name not in skipped]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--set", dest="among", choices=list(SETS), default="suite",
                        help="the suite (default) or the development set")
    parser.add_argument("--budget", type=float, default=10.0, help="minutes per entry")
    parser.add_argument("--only", default="", help="comma-separated entry names")
    parser.add_argument("--skip", default="", help="comma-separated entry names to leave out")
    parser.add_argument("--out", type=Path, default=Path("kiln-out/suite"))
    parser.add_argument("--parallel", type=int, default=1, help="entries optimized at once")
    argv = sys.argv[1:]
    extra = argv[argv.index("--") + 1:] if "--" in argv else []
    args = parser.parse_args(argv[: argv.index("--")] if "--" in argv else argv)
    items = selected(args.only, args.skip, args.among)
    args.out.mkdir(parents=True, exist_ok=True)
    finished: dict[str, Outcome] = {}
    with ThreadPoolExecutor(max_workers=args.parallel) as pool:
        running = {pool.submit(optimize, item, args, extra): item for item in items}
        for future in as_completed(running):
            item = running[future]
            finished[item.name] = future.result()
            print(f"{item.name}: done in {finished[item.name].minutes:.1f} min "
                  f"({len(finished)}/{len(items)})", file=sys.stderr, flush=True)
            done = [finished[i.name] for i in items if i.name in finished]
            (args.out / "suite.md").write_text(table(done) + "\n")
    print(table([finished[item.name] for item in items]))
    return 0


if __name__ == "__main__":
    exit_on_input_error(main)
