"""A site's own PyTorch times, eager and under torch.compile, by the evaluator's timing rules.

A kernel has to beat the faster of the two to be worth installing: where Kiln finds nothing
better, the installed model hands the site to inductor (or leaves it eager, whichever is
faster), so the search measures every candidate against that.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from core.evaluate.config import EvalConfig
from core.runtime.problem_loader import load_problem
from core.runtime.tracing import set_tracing_rules
from core.timing.device_lock import device_lock_path, exclusive_device
from core.timing.model_timing import rotation_sets, time_model
from core.timing.precision import fp32_matmuls


@dataclass(frozen=True)
class SiteBaseline:
    eager_ms: float
    compile_ms: float | None  # None: not compiled (`time_site(..., compile=False)`)

    @property
    def best_ms(self) -> float:
        return self.eager_ms if self.compile_ms is None else min(self.eager_ms, self.compile_ms)


def time_site(problem_path: Path, config: EvalConfig, compile: bool = True) -> SiteBaseline:
    """Eager and compiled medians of the site problem's `Model` on its seed-0 inputs;
    `compile=False`: eager only (a run that keeps sites out of torch.compile)."""
    with fp32_matmuls(config.allow_tf32):
        return _time_site(problem_path, config, compile)


def _time_site(problem_path: Path, config: EvalConfig, compile: bool) -> SiteBaseline:
    device = torch.device(config.device)
    problem = load_problem(problem_path)
    torch.manual_seed(config.seeds[0])
    model = problem.model_class(*problem.init_inputs()).to(device).eval()
    pristine = problem.inputs(config.seeds[0], device)
    input_sets = rotation_sets(pristine, device, config.rotation_budget_bytes)
    runs: list[torch.nn.Module] = [model]
    if compile:
        set_tracing_rules()
        runs.append(torch.compile(model, dynamic=False))
        with torch.no_grad():
            runs[1](*input_sets[0])  # compiled here, not inside the timing
    with exclusive_device(config.gpu_lock or device_lock_path(config.device)):
        times = [time_model(run, input_sets, device, config.warmup_count, config.trial_count,
                            config.warmup_time_ms, queue_ahead=True,
                            trials_within=config.trials_within).median_ms for run in runs]
    del input_sets, pristine, model, runs
    if device.type == "cuda":
        # This runs in the optimizer's own process: hand the site's memory back to the
        # device for the evaluation workers.
        torch.cuda.empty_cache()
    return SiteBaseline(eager_ms=times[0], compile_ms=times[1] if compile else None)
