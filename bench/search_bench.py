"""The tree search against random expansion on a GPU, with the same budget. Prints one table.

    python bench/search_bench.py MODEL [MODEL ...] [--budget 10] [--strategies uct,random]
                                 [--dtype bf16] [--out DIR] [-- extra core.optimize args]

Each model is optimized once per strategy by `python -m core.optimize` in its own process
and store. Per searched site the table gives the evaluations needed to reach 90% of the
site's final best speedup, the winner's tier, the best speedup against the site's PyTorch
baseline, and how many kernels were evaluated in all.
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
    strategy: str
    site: str
    family: str
    share: float
    evaluated: int
    to_90: int | None  # evaluations until 90% of the final best speedup; None: nothing won
    tier: str
    speedup: float


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


def optimize(model: str, strategy: str, args: argparse.Namespace,
             extra: list[str]) -> tuple[list[SiteOutcome], float]:
    name = model.replace("/", "_").replace(":", "_")
    db = args.out / f"{name}-{strategy}.db"
    db.unlink(missing_ok=True)
    command = [sys.executable, "-m", "core.optimize", model, "--device", args.device,
               "--budget", str(args.budget), "--strategy", strategy, "--db", str(db),
               "--out", str(args.out / f"{name}-{strategy}"), "--json", *extra]
    if args.dtype:
        command += ["--dtype", args.dtype]
    started = time.perf_counter()
    result = subprocess.run(command, capture_output=True, text=True)
    seconds = time.perf_counter() - started
    (args.out / f"{name}-{strategy}.log").write_text(result.stderr)
    if result.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed ({result.returncode}):\n"
                         f"{result.stderr[-3000:]}")
    report = json.loads(result.stdout)
    outcomes = []
    with open_reader(db) as reader:
        for site in reader.sites(report["run_id"]):
            candidates = reader.candidates(site_id=site.id)
            if not candidates:
                continue
            to_90, speedup, tier = evaluations_to_fraction(candidates)
            outcomes.append(SiteOutcome(model, strategy, site.key, site.family, site.share,
                                        len(candidates), to_90, tier, speedup))
    return outcomes, seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="+")
    parser.add_argument("--budget", type=float, default=10.0, help="minutes per run")
    parser.add_argument("--strategies", default="uct,random")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dtype")
    parser.add_argument("--out", type=Path, default=Path("kiln-out/search-bench"))
    argv = sys.argv[1:]
    extra = argv[argv.index("--") + 1:] if "--" in argv else []
    args = parser.parse_args(argv[: argv.index("--")] if "--" in argv else argv)
    args.out.mkdir(parents=True, exist_ok=True)
    rows: list[SiteOutcome] = []
    spent: dict[tuple[str, str], float] = {}
    for model in args.models:
        for strategy in args.strategies.split(","):
            print(f"optimizing {model} with {strategy} search ({args.budget} min)...",
                  file=sys.stderr, flush=True)
            outcomes, seconds = optimize(model, strategy, args, extra)
            rows += outcomes
            spent[model, strategy] = seconds
    print("| model | site | family | share | strategy | evaluated | evals to 90% of best "
          "| winner tier | best speedup |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in sorted(rows, key=lambda r: (r.model, -r.share, r.site, r.strategy)):
        print(f"| {r.model} | {r.site} | {r.family} | {r.share:.1%} | {r.strategy} "
              f"| {r.evaluated} | {r.to_90 if r.to_90 is not None else '-'} | {r.tier} "
              f"| {r.speedup:.2f}x |")
    print()
    for (model, strategy), seconds in spent.items():
        print(f"- {model}, {strategy}: {seconds / 60:.1f} min wall, whole run")


if __name__ == "__main__":
    main()
