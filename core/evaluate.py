"""A verdict on a candidate kernel for a KernelBench-format problem: compiled, correct, timed.

    python -m core.evaluate PROBLEM CANDIDATE [--device cuda|cpu] [--trials N] [--seed S] [--json]

Exit code 0 when the candidate is accepted, 1 when it is rejected, 2 on bad input.

From Python:

    verdict = evaluate(problem_path, candidate_source, EvalConfig())
    with Evaluator(EvalConfig(), workers=4) as ev:
        verdicts = ev.evaluate_many([(problem_path, source), ...])

Static rules run here, in the caller's process; everything that executes the candidate runs in
worker processes. On a machine without a GPU, CUDA candidates are compile-checked with nvcc.
"""

from __future__ import annotations

import argparse
import atexit
import re
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

import torch

from core.cuda_runtime import nvcc_check
from core.errors import KilnInputError, exit_on_input_error
from core.eval_config import EvalConfig
from core.pool import WorkerPool
from core.problem_loader import (
    check_candidate_source,
    check_problem_source,
    defined_names,
    read_source,
)
from core.static_check import StaticReport, check_candidate, problem_anchors
from core.verdict import Reason, Verdict
from core.worker import Request

__all__ = ["EvalConfig", "Evaluator", "Verdict", "evaluate", "main"]

NVCC_ARCH = "sm_90"
NVCC_LINE = re.compile(r"kernel\.cu\((\d+)\)")


def nvcc_verdict(report: StaticReport) -> Verdict:
    """Without a GPU a CUDA candidate cannot run; its CUDA sources are compiled with nvcc."""
    logs = []
    for python_line, source in report.cuda_sources:
        try:
            ok, log = nvcc_check(source, NVCC_ARCH)
        except FileNotFoundError as err:
            raise KilnInputError(f"cannot compile-check CUDA without a GPU: {err}",
                                 "install the CUDA toolkit or put nvcc on PATH") from err
        if not ok:
            logs.append(NVCC_LINE.sub(
                lambda m, start=python_line: f"kernel.cu({m[1]}) [candidate line "
                                             f"{start + int(m[1]) - 1}]", log))
    if logs:
        log = "\n".join(logs)
        first = next((line for line in log.splitlines() if "error" in line), log.splitlines()[0])
        return Verdict.rejected(Reason.COMPILE_ERROR, f"nvcc: {first}", compile_log=log,
                                tier=report.tier)
    return Verdict.rejected(
        Reason.NEEDS_GPU,
        f"its CUDA compiles (nvcc -arch={NVCC_ARCH}), but running it needs a GPU",
        compiled=True, tier=report.tier, timing_device="none",
    )


def screen(problem_path: str | Path, source: str, config: EvalConfig) -> Verdict | Request:
    """Static rules: a verdict when they settle the matter, else a request for a worker."""
    problem_path = Path(problem_path).resolve()
    problem_source = read_source(problem_path, "problem")
    check_problem_source(problem_source, problem_path)
    try:
        report = check_candidate(source, problem_source)
    except SyntaxError as err:
        log = f"line {err.lineno}: {err.msg}\n    {(err.text or '').rstrip()}"
        return Verdict.rejected(Reason.COMPILE_ERROR, f"does not parse: line {err.lineno}: "
                                f"{err.msg}", compile_log=log)
    if "ModelNew" not in defined_names(source):
        return Verdict.rejected(Reason.NO_MODEL_NEW, "the candidate defines no ModelNew")
    if not report.ok:
        return Verdict.rejected(Reason.STATIC_CHECK, "; ".join(report.violations),
                                tier=report.tier)
    if "cuda" in report.tier and config.device == "cpu":
        return nvcc_verdict(report)
    return Request(str(problem_path), source, config.to_dict(), report.tier,
                   sorted(problem_anchors(problem_source)))


def job(problem_path: str | Path, source: str, config: EvalConfig
        ) -> Callable[[Callable[[Request], Verdict]], Verdict]:
    def run(on_worker: Callable[[Request], Verdict]) -> Verdict:
        screened = screen(problem_path, source, config)
        if isinstance(screened, Verdict):
            return screened
        verdict = on_worker(screened)
        verdict.tier = screened.tier
        return verdict

    return run


class Evaluator:
    """A pool of warm worker processes judging candidates, `workers` at a time."""

    def __init__(self, config: EvalConfig | None = None, workers: int = 1) -> None:
        self.config = config or EvalConfig()
        if self.config.device == "cuda" and not torch.cuda.is_available():
            raise KilnInputError("--device cuda was asked for, but no CUDA GPU is visible",
                                 "run on a machine with an NVIDIA GPU, or pass --device cpu")
        self.pool = WorkerPool(self.config, workers)

    def __enter__(self) -> Evaluator:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.pool.close()

    @property
    def replacements(self) -> int:
        """How many workers were replaced after a crash, a timeout or a CUDA error."""
        return self.pool.replacements

    def evaluate(self, problem_path: str | Path, candidate_source: str) -> Verdict:
        return self.evaluate_many([(problem_path, candidate_source)])[0]

    def evaluate_many(self, items: Sequence[tuple[str | Path, str]], counters: bool = False
                      ) -> list[Verdict]:
        """Verdicts in the order of `items`, keeping every worker busy. `counters`: with
        hardware counters (`core.counters`) for each, which takes seconds a candidate."""
        config = self.config.with_counters() if counters else self.config
        return self.pool.map([job(path, source, config) for path, source in items])


_shared: dict[str, Evaluator] = {}


def evaluate(problem_path: str | Path, candidate_source: str, config: EvalConfig) -> Verdict:
    """One verdict, from a worker kept warm for later calls with the same config."""
    key = repr(config)
    if key not in _shared:
        if not _shared:
            atexit.register(lambda: [ev.close() for ev in _shared.values()])
        _shared[key] = Evaluator(config, workers=1)
    return _shared[key].evaluate(problem_path, candidate_source)


def describe(verdict: Verdict) -> str:
    status = "accepted" if verdict.accepted else f"rejected [{verdict.reason_code}]"
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
    parser.add_argument("--seed", type=int, default=0, help="first of the correctness seeds")
    parser.add_argument("--json", action="store_true", help="print the verdict as one JSON object")
    parser.add_argument("--counters", action="store_true",
                        help="read the candidate's hardware counters with Nsight Compute (GPU)")
    args = parser.parse_args(argv)
    source = read_source(args.candidate, "candidate")
    check_candidate_source(source, args.candidate)
    check_problem_source(read_source(args.problem, "problem"), args.problem)
    config = EvalConfig(seeds=(args.seed, args.seed + 1, args.seed + 2), trials=args.trials,
                        **({"device": args.device} if args.device else {}))
    with Evaluator(config, workers=1) as evaluator:
        verdict = evaluator.evaluate_many([(args.problem, source)], counters=args.counters)[0]
    print(verdict.to_json() if args.json else describe(verdict))
    return 0 if verdict.accepted else 1


if __name__ == "__main__":
    exit_on_input_error(lambda: main(sys.argv[1:]))
