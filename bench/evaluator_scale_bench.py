"""The evaluator at real sizes: KernelBench problems optimized a few at a time on one GPU.

    python -m bench.evaluator_scale_bench PROBLEM [PROBLEM ...] [--parallel 3] [--budget 3]
                                          [--stop-after MIN] [--resume] [--out DIR]
                                          [-- extra core.optimize arguments]

Each problem is optimized by `python -m core.optimize` in its own process and store, `--parallel`
of them at once (the evaluator's device memory budgets and the device lock keep them from
disturbing each other). Per problem the table gives whether the run ended cleanly, the candidates
judged and judged per minute of search, the median seconds a candidate spent in each phase (and
outside them: the worker's messages, loading the problem, writing the candidate's file), the
peak device memory of a judged candidate over its site problem's input and output bytes, and the
peak device memory of the whole run (every process of it, sampled from nvidia-smi each half
second) over the problem's own input and output bytes, and that of the run's own process alone
(what it keeps outside its workers: its profile, baselines and end-to-end check).
The table is printed and written to `DIR/evaluator_scale.md`; each run's log and JSON report are
kept in `DIR/<problem>/`. `--stop-after` interrupts each run after so many minutes, as Ctrl-C
would, leaving it resumable; `--resume` goes on with each problem's interrupted run in DIR, to
its own budget (a budget longer than one sitting on a GPU is spent in several). The same runs'
end-to-end results (against eager and torch.compile,
as `bench.suite_bench` tables them) are written to `DIR/suite.md`, so that one pass over a set
of problems gives both.
"""

from __future__ import annotations

import argparse
import json
import signal
import statistics
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.processes import process_table  # noqa: E402
from bench.suite_bench import Outcome, failed_outcome, outcome_of  # noqa: E402
from bench.suite_bench import table as suite_table  # noqa: E402
from core.evaluate.memory import problem_bytes  # noqa: E402
from core.optimize.interrupt import EXIT_INTERRUPTED  # noqa: E402
from store import PHASES, open_reader  # noqa: E402
from store.records import Candidate  # noqa: E402


@dataclass
class Row:
    name: str
    status: str
    judged: int = 0
    per_minute: float = 0.0
    phases: dict[str, float] = field(default_factory=dict)
    memory_ratio: float | None = None  # peak device memory over the site's io bytes, worst site
    io_gb: float = 0.0
    run_peak_gb: float | None = None  # every process of the run together, sampled
    own_peak_gb: float | None = None  # the optimize process alone (its own steps, what it keeps)
    problem_io_gb: float = 0.0
    minutes: float = 0.0
    outcome: Outcome | None = None  # the end-to-end result, as the suite's table has it


class RunMemory:
    """The device memory of each run's process tree, sampled from nvidia-smi until stopped."""

    def __init__(self, period_s: float = 0.5) -> None:
        self.roots: dict[int, str] = {}
        self.peaks: dict[str, int] = {}
        self.own_peaks: dict[str, int] = {}  # the run's own process, without its workers
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._sample, args=(period_s,), daemon=True)
        self.thread.start()

    def _sample(self, period_s: float) -> None:
        while not self.stop.wait(period_s):
            used = _process_memory()
            parents = {pid: stat.parent for pid, stat in process_table().items()}
            totals: dict[str, int] = {}
            for pid, amount in used.items():
                name = self._run_of(pid, parents)
                if name is not None:
                    totals[name] = totals.get(name, 0) + amount
            for name, total in totals.items():
                self.peaks[name] = max(self.peaks.get(name, 0), total)
            for pid, name in list(self.roots.items()):
                if pid in used:
                    self.own_peaks[name] = max(self.own_peaks.get(name, 0), used[pid])

    def _run_of(self, pid: int, parents: dict[int, int]) -> str | None:
        while pid > 1:
            if pid in self.roots:
                return self.roots[pid]
            pid = parents.get(pid, 0)
        return None


def _process_memory() -> dict[int, int]:
    """Device bytes per host PID, from nvidia-smi."""
    result = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory",
                             "--format=csv,noheader,nounits"], capture_output=True, text=True)
    used = {}
    for line in result.stdout.splitlines():
        pid, _, mib = line.partition(",")
        if pid.strip().isdigit() and mib.strip().isdigit():
            used[int(pid)] = int(mib) << 20
    return used



def _time(stamp: str) -> float:
    return datetime.fromisoformat(stamp).timestamp()


def interrupted_run(db: Path) -> int | None:
    """The id of the store's latest run when it was interrupted, else None."""
    if not db.exists():
        return None
    with open_reader(db) as reader:
        if not reader.runs():
            return None
        run = reader.run(reader.latest_run_id())
        return run.id if run.status == "interrupted" else None


def optimize(command: list[str], stop_after: float | None, name: str,
             roots: dict[int, str]) -> tuple[int, str, str]:
    """Run `python -m core.optimize`, its process named in `roots` (for `RunMemory`); past
    `stop_after` minutes, interrupt it as Ctrl-C does and wait for it to store what it is
    judging."""
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    roots[process.pid] = name
    try:
        stdout, stderr = process.communicate(
            timeout=None if stop_after is None else stop_after * 60)
    except subprocess.TimeoutExpired:
        process.send_signal(signal.SIGINT)
        stdout, stderr = process.communicate()
    return process.returncode, stdout, stderr


def verdict_lines(candidates: list[Candidate]) -> str:
    """Each judged candidate's verdict in a line: its id, tier, code ("accepted" for an accepted
    one, with its time), its reason, and for a judge's failure or a crash the traceback's last
    lines, so that a problem whose kernels all failed says why; then, after "·", the candidate
    it was changed from and the generator's rationale, which name the settings it tried."""
    lines = []
    for c in candidates:
        if not c.verdict:
            continue
        v = c.verdict
        code = v.get("reason_code") or "accepted"
        reason = str(v.get("reason") or f"{v.get('latency_ms')} ms, {v.get('speedup')}x")
        if code in ("judge_error", "crash", "judge_out_of_memory"):
            reason += " | " + " | ".join(str(v.get("compile_log") or "").splitlines()[-4:])
        origin = (f"from {c.summary.parent_id}: " if c.summary.parent_id is not None
                  else "draft: ")
        lines.append(f"{c.id} {c.summary.tier} {code}: {' '.join(reason.split())[:1200]} · "
                     f"{origin}{' '.join(c.summary.rationale.split())[:300]}\n")
    return "".join(lines)


def measure(problem: Path, args: argparse.Namespace, extra: list[str],
            memory: RunMemory) -> Row:
    out = args.out / problem.stem
    out.mkdir(parents=True, exist_ok=True)
    db = out / "kiln.db"
    resumed = interrupted_run(db) if args.resume else None
    command = [sys.executable, "-m", "core.optimize", "--json", "--db", str(db), "--out",
               str(out), *(["--resume", str(resumed)] if resumed is not None else [
                   str(problem), "--device", "cuda", "--dtype", args.dtype, "--budget",
                   str(args.budget), "--generator", "rules"]), *extra]
    began = time.perf_counter()
    returncode, stdout, stderr = optimize(command, args.stop_after, problem.stem, memory.roots)
    minutes = (time.perf_counter() - began) / 60
    log = "optimize.log" if resumed is None else f"optimize-resume{resumed}.log"
    (out / log).write_text(stderr)
    (out / "report.json").write_text(stdout)
    status = ("ok" if returncode == 0 else
              "interrupted (--resume goes on with it)" if returncode == EXIT_INTERRUPTED else
              f"exit {returncode}: " + (stderr.strip().splitlines() or ["no output"])[-1][:100])
    row = Row(problem.stem, status, minutes=minutes)
    row.outcome = (outcome_of(problem.stem, args.dtype, json.loads(stdout), minutes)
                   if returncode == 0 else
                   failed_outcome(problem.stem, args.dtype, minutes, returncode, stderr))
    whole = problem_bytes(problem)
    row.problem_io_gb = (whole.inputs + whole.outputs) / 1e9
    peak, own = memory.peaks.get(problem.stem), memory.own_peaks.get(problem.stem)
    row.run_peak_gb = None if peak is None else peak / 1e9
    row.own_peak_gb = None if own is None else own / 1e9
    if not (out / "kiln.db").exists():
        return row
    with open_reader(out / "kiln.db") as reader:
        if not reader.runs():  # the run ended before it began (its status says why)
            return row
        run_id = reader.latest_run_id()
        candidates = [reader.candidate(c.id) for s in reader.sites(run_id)
                      for c in reader.candidates(site_id=s.id)]
        verdicts = [c.verdict for c in candidates if c.verdict]
        row.judged = len(verdicts)
        (out / "verdicts.txt").write_text(verdict_lines(candidates))
        # From the start of the first judging to the last verdict: a candidate is stored once
        # judged, so its stamps alone leave out the first batch (two candidates judged side by
        # side would time nothing).
        judging = reader.judging(run_id)
        if judging:
            began = min(_time(j.judged_at) - (j.eval_seconds or 0.0) for j in judging)
            window = max(_time(j.judged_at) for j in judging) - began
            row.per_minute = len(judging) / (window / 60) if window > 0 else 0.0
        row.phases = {p: statistics.median(v.get("phase_seconds", {}).get(p, 0.0)
                                           for v in verdicts)
                      for p in PHASES} if verdicts else {}
        # What no phase holds: the worker's messages, loading the problem, writing the file.
        row.phases[OTHER] = statistics.median(
            (v.get("eval_seconds") or 0.0) - sum(v.get("phase_seconds", {}).values())
            for v in verdicts) if verdicts else 0.0
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


OTHER = "outside the phases"


def table(rows: list[Row]) -> str:
    header = ("| problem | status | judged | per minute | site io GB | peak / io | "
              "problem io GB | run peak GB | its own GB | "
              + " | ".join(f"{p} s" for p in (*PHASES, OTHER)) + " | minutes |")
    lines = [header, "|" + " --- |" * (header.count("|") - 1)]
    for r in rows:
        ratio = "-" if r.memory_ratio is None else f"{r.memory_ratio:.2f}"
        run_peak = "-" if r.run_peak_gb is None else f"{r.run_peak_gb:.1f}"
        own_peak = "-" if r.own_peak_gb is None else f"{r.own_peak_gb:.1f}"
        phases = " | ".join(f"{r.phases.get(p, 0.0):.2f}" for p in (*PHASES, OTHER))
        lines.append(f"| {r.name} | {r.status} | {r.judged} | {r.per_minute:.1f} | "
                     f"{r.io_gb:.2f} | {ratio} | {r.problem_io_gb:.2f} | {run_peak} | {own_peak} | "
                     f"{phases} | {r.minutes:.1f} |")
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
    parser.add_argument("--dtype", default="fp32", help="the problems' dtype, as the suite's")
    parser.add_argument("--out", type=Path, default=Path("kiln-out/evaluator-scale"))
    parser.add_argument("--stop-after", type=float, default=None, metavar="MIN",
                        help="interrupt each run after MIN minutes, leaving it resumable")
    parser.add_argument("--resume", action="store_true",
                        help="go on with each problem's interrupted run in --out (the others "
                             "start anew)")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    memory = RunMemory()
    rows: list[Row] = []
    with ThreadPoolExecutor(args.parallel) as pool:
        futures = [pool.submit(measure, p, args, extra, memory) for p in args.problems]
        for future in as_completed(futures):  # the table so far is kept if the rest is cut
            rows.append(future.result())
            (args.out / "evaluator_scale.md").write_text(table(rows) + "\n")
            outcomes = [r.outcome for r in rows if r.outcome is not None]
            (args.out / "suite.md").write_text(suite_table(outcomes) + "\n")
    memory.stop.set()
    text = table(rows)
    print(text)
    return 0 if all(r.status == "ok" for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
