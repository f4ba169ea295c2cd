"""`python -m core.evaluate PROBLEM CANDIDATE`: one verdict, printed for people or as JSON.

    python -m core.evaluate PROBLEM CANDIDATE [--device cuda|cpu] [--trials N] [--seed S] [--json]

Exit code 0 when the candidate is accepted (correct and faster than the problem's PyTorch
reference), 1 when it is not (rejected, or correct but slower), 2 on bad input.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

from core.evaluate.config import EvalConfig
from core.evaluate.evaluator import Evaluator
from core.evaluate.verdict import Verdict
from core.runtime.problem_loader import check_candidate_source, check_problem_source, read_source


def describe(verdict: Verdict) -> str:
    if verdict.accepted:
        status = "accepted"
    elif verdict.correct:
        status = f"correct, not accepted [{verdict.reason_code}]"
    else:
        status = f"rejected [{verdict.reason_code}]"
    lines = [f"{status}{': ' + verdict.reason if verdict.reason else ''}"]
    if verdict.max_abs_err is not None:
        lines.append(f"max abs err {verdict.max_abs_err:.3g}, max rel err "
                     f"{verdict.max_rel_err:.3g} ({verdict.tolerance_name} tolerance "
                     f"{verdict.tolerance:g}), checked on {', '.join(verdict.trials_checked)}")
    if verdict.latency_ms is not None:
        lines.append(f"latency {verdict.latency_ms:.4f} ms (median of {verdict.timing_trials}, "
                     f"stdev {verdict.latency_stdev_ms:.4f}), baseline {verdict.baseline_ms:.4f}"
                     f" ms, speedup {verdict.speedup:.2f}x on {verdict.timing_device}"
                     f"{' [flagged: re-verified]' if verdict.flagged else ''}")
    if verdict.diagnosis:
        lines.append(f"diagnosis: {verdict.diagnosis}")
    if verdict.counters is not None and not verdict.counters.get("kernels"):
        lines += [f"no hardware counters: {note}" for note in verdict.counters.get("notes", [])]
    if verdict.library_ops:
        lines.append(f"library ops: {', '.join(verdict.library_ops)}")
    if verdict.compile_log:
        lines.append(f"compile log:\n{verdict.compile_log}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m core.evaluate", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("problem", type=Path, help="KernelBench-format problem file")
    parser.add_argument("candidate", type=Path, help="module source defining ModelNew")
    parser.add_argument("--device", choices=("cuda", "cpu"), default=None,
                        help="default: cuda when a GPU is visible, else cpu")
    parser.add_argument("--trials", type=int, default=None, help="timing trials")
    parser.add_argument("--seed", type=int, default=None,
                        help="the inputs' seed, to reproduce a verdict (default: drawn anew)")
    parser.add_argument("--json", action="store_true", help="print the verdict as one JSON object")
    parser.add_argument("--counters", action="store_true",
                        help="read the candidate's hardware counters with Nsight Compute (GPU)")
    args = parser.parse_args(argv)
    source = read_source(args.candidate, "candidate")
    check_candidate_source(source, args.candidate)
    check_problem_source(read_source(args.problem, "problem"), args.problem)
    config = EvalConfig(input_seed=args.seed, trials=args.trials,
                        **({"device": args.device} if args.device else {}))
    with Evaluator(config, workers=1) as evaluator:
        verdict = evaluator.evaluate_many([(args.problem, source)], counters=args.counters)[0]
    print(verdict.to_json() if args.json else describe(verdict))
    return 0 if verdict.accepted else 1

