"""A verdict on a candidate kernel for a KernelBench-format problem: compiled, correct, timed.

From Python:

    verdict = evaluate(problem_path, candidate_source, EvalConfig())
    with Evaluator(EvalConfig(), workers=4) as ev:
        verdicts = ev.evaluate_many([(problem_path, source), ...])

Static rules run here, in the caller's process; everything that executes the candidate runs in
worker processes. On a machine without a GPU, CUDA candidates are compile-checked with nvcc.
"""

from __future__ import annotations

import atexit
import dataclasses
import re
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from pathlib import Path

import torch

from core.evaluate.config import EvalConfig
from core.evaluate.pool import Job, WorkerPool
from core.evaluate.static_rules import StaticReport, check_candidate, problem_anchors
from core.evaluate.verdict import Reason, Verdict
from core.evaluate.worker import Request
from core.runtime.cuda import nvcc_check
from core.runtime.errors import KilnInputError
from core.runtime.problem_loader import (
    check_problem_source,
    defined_names,
    read_source,
)

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
        report = check_candidate(source, problem_source,
                                 config.tf32_for(problem_anchors(problem_source)))
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


def counter_flags(count: int, counters: bool | Sequence[bool]) -> list[bool]:
    """Whether each of `count` items is judged with hardware counters: all (`counters` True),
    none, or those whose flag in `counters` is set."""
    flags = [counters] * count if isinstance(counters, bool) else list(counters)
    if len(flags) != count:
        raise ValueError(f"{len(flags)} counters flags for {count} items")
    return flags


def item_configs(config: EvalConfig, count: int, counters: bool | Sequence[bool],
                 race_ms: float | None = None) -> list[EvalConfig]:
    """The config of each of `count` items, with hardware counters as `counter_flags` says,
    and racing the site's best time `race_ms` (`EvalConfig.race_ms`) where it is given."""
    flags = counter_flags(count, counters)
    if race_ms is not None:
        config = dataclasses.replace(config, race_ms=race_ms)
    profiled = config.with_counters() if any(flags) else config
    return [profiled if flag else config for flag in flags]


def job(problem_path: str | Path, source: str, config: EvalConfig) -> Job:
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

    @property
    def slots(self) -> int:
        """Candidates judged at once."""
        return self.pool.size

    def evaluate_many(self, items: Sequence[tuple[str | Path, str]],
                      counters: bool | Sequence[bool] = False,
                      race_ms: float | None = None) -> list[Verdict]:
        """Verdicts in the order of `items`, keeping every worker busy. `counters`: with
        hardware counters (`core.evaluate.counters`), which take seconds a candidate, for each
        item, or for those whose flag is set. `race_ms`: the site's best time, which clear
        losers are timed against briefly (`EvalConfig.race_ms`)."""
        return self.pool.map(self._jobs(items, counters, race_ms))

    def submit(self, items: Sequence[tuple[str | Path, str]],
               counters: bool | Sequence[bool] = False,
               race_ms: float | None = None) -> list[Future[Verdict]]:
        """`evaluate_many` without waiting: a future a verdict, each judged as soon as a worker
        is free, so that a caller can hand out more work as each comes back."""
        return [self.pool.submit(one) for one in self._jobs(items, counters, race_ms)]

    def stop_now(self, futures: Sequence[Future[Verdict]]) -> None:
        """Ctrl-C while `futures` are pending: none still queued starts; the busy are ended."""
        self.pool.stop_now(futures)

    def _jobs(self, items: Sequence[tuple[str | Path, str]], counters: bool | Sequence[bool],
              race_ms: float | None) -> list[Job]:
        configs = item_configs(self.config, len(items), counters, race_ms)
        return [job(path, source, config)
                for (path, source), config in zip(items, configs, strict=True)]


_shared: dict[str, Evaluator] = {}


def evaluate(problem_path: str | Path, candidate_source: str, config: EvalConfig) -> Verdict:
    """One verdict, from a worker kept warm for later calls with the same config."""
    key = repr(config)
    if key not in _shared:
        if not _shared:
            atexit.register(lambda: [ev.close() for ev in _shared.values()])
        _shared[key] = Evaluator(config, workers=1)
    return _shared[key].evaluate(problem_path, candidate_source)
