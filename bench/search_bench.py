"""The tree search against random expansion on a GPU, with the same budget. Prints one table.

    python bench/search_bench.py MODEL [MODEL ...] [--budget 10] [--arms uct,random]
                                 [--dtype bf16] [--out DIR] [--parallel]
                                 [-- extra core.optimize args]

Each model is optimized once per arm by `python -m core.optimize` in its own process and
store. The arms: `uct` and `random` (the search strategy), `feedback` (UCT with diagnoses and
hardware counters steering the generator, the default) and `no-feedback` (UCT, the generator
sees verdicts and timings only). Per searched site the table gives the evaluations needed to
reach 90% of the site's final best speedup over eager, the winner's tier, the best speedup over
eager and over the faster of eager and torch.compile, and how many kernels were evaluated.

`--parallel` starts every run at once. They share the GPU: timing takes turns through the
machine's device lock, so no measurement is disturbed, but each run gets only its share of the
timing slots; arms compared this way compete on equal terms.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from store import open_reader  # noqa: E402
from store.records import CandidateSummary  # noqa: E402


@dataclass(frozen=True)
class SiteOutcome:
    model: str
    arm: str
    site: str
    family: str
    share: float
    evaluated: int
    to_90: int | None  # evaluations until 90% of the final best speedup; None: nothing won
    tier: str
    speedup: float
    speedup_vs_faster: float  # over the faster of eager and torch.compile, as the search ranks


def evaluations_to_fraction(candidates: list[CandidateSummary], fraction: float = 0.9
                            ) -> tuple[int | None, float, str]:
    """(evaluations to reach `fraction` of the best speedup, best speedup, winner's tier)."""
    accepted = [(i, c) for i, c in enumerate(candidates, 1) if c.accepted and c.speedup]
    if not accepted:
        return None, 1.0, "torch"
    index, best = max(accepted, key=lambda pair: pair[1].speedup)
    if best.speedup <= 1.0:
        return None, 1.0, "torch"
    reached = next(i for i, c in accepted if c.speedup >= fraction * best.speedup)
    return reached, best.speedup, best.tier


@dataclass
class Started:
    model: str
    arm: str
    db: Path
    log: Path
    command: list[str]
    process: subprocess.Popen
    began: float


ARMS = {"uct": ["--strategy", "uct"], "random": ["--strategy", "random"],
        "feedback": ["--feedback"], "no-feedback": ["--no-feedback", "--counters", "0"]}


def start(model: str, arm: str, args: argparse.Namespace, extra: list[str]) -> Started:
    name = model.replace("/", "_").replace(":", "_")
    db = args.out / f"{name}-{arm}.db"
    db.unlink(missing_ok=True)
    command = [sys.executable, "-m", "core.optimize", model, "--device", args.device,
               "--budget", str(args.budget), *ARMS[arm], "--db", str(db),
               "--out", str(args.out / f"{name}-{arm}"), "--json", *extra]
    if args.dtype:
        command += ["--dtype", args.dtype]
    log = args.out / f"{name}-{arm}.log"
    with log.open("w") as stderr:
        process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=stderr, text=True)
    return Started(model, arm, db, log, command, process, time.perf_counter())


def outcomes_of(run: Started) -> tuple[list[SiteOutcome], float]:
    stdout, _ = run.process.communicate()
    seconds = time.perf_counter() - run.began
    if run.process.returncode != 0:
        print(f"{' '.join(run.command)} failed ({run.process.returncode}):\n"
              f"{run.log.read_text()[-3000:]}", file=sys.stderr, flush=True)
        return [], seconds
    report = json.loads(stdout)
    searched = {site["id"]: site["best"]["speedup"] for site in report["searched"]}
    outcomes = []
    with open_reader(run.db) as reader:
        for site in reader.sites(report["run_id"]):
            candidates = reader.candidates(site_id=site.id)
            if not candidates:
                continue
            to_90, speedup, tier = evaluations_to_fraction(candidates)
            outcomes.append(SiteOutcome(run.model, run.arm, site.key, site.family,
                                        site.share, len(candidates), to_90, tier, speedup,
                                        searched.get(site.key, 1.0)))
    return outcomes, seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="+")
    parser.add_argument("--budget", type=float, default=10.0, help="minutes per run")
    parser.add_argument("--arms", default="uct,random",
                        help=f"comma-separated, of: {', '.join(ARMS)}")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dtype")
    parser.add_argument("--out", type=Path, default=Path("kiln-out/search-bench"))
    parser.add_argument("--parallel", action="store_true",
                        help="start every run at once; they take turns timing on the GPU")
    argv = sys.argv[1:]
    extra = argv[argv.index("--") + 1:] if "--" in argv else []
    args = parser.parse_args(argv[: argv.index("--")] if "--" in argv else argv)
    args.out.mkdir(parents=True, exist_ok=True)
    rows: list[SiteOutcome] = []
    spent: dict[tuple[str, str], float] = {}
    arms = args.arms.split(",")
    if any(arm not in ARMS for arm in arms):
        parser.error(f"--arms takes {', '.join(ARMS)}, not {args.arms!r}")
    pairs = [(model, arm) for model in args.models for arm in arms]
    waiting: list[Started] = []
    for model, arm in pairs:
        print(f"optimizing {model}, {arm} ({args.budget} min)...", file=sys.stderr, flush=True)
        waiting.append(start(model, arm, args, extra))
        if not args.parallel:
            outcomes, spent[model, arm] = outcomes_of(waiting.pop())
            rows += outcomes
    for run in waiting:
        outcomes, spent[run.model, run.arm] = outcomes_of(run)
        rows += outcomes
    print("| model | site | family | share | arm | evaluated | evals to 90% of best "
          "| winner tier | best x eager | best x faster |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in sorted(rows, key=lambda r: (r.model, -r.share, r.site, r.arm)):
        print(f"| {r.model} | {r.site} | {r.family} | {r.share:.1%} | {r.arm} "
              f"| {r.evaluated} | {r.to_90 if r.to_90 is not None else '-'} | {r.tier} "
              f"| {r.speedup:.2f}x | {r.speedup_vs_faster:.2f}x |")
    print()
    for (model, arm), seconds in spent.items():
        print(f"- {model}, {arm}: {seconds / 60:.1f} min wall, whole run")


if __name__ == "__main__":
    main()
