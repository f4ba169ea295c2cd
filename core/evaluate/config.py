"""The evaluator's settings: one dataclass, passed to worker processes as JSON."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

import torch

from core.profile.gpu_peaks import device_peaks
from core.profile.roofline import GpuPeaks

# Per-device defaults. On CUDA 100 trials after 10 warm-ups keep the median of a 30 µs kernel
# steady while costing a few milliseconds; the Triton interpreter on the CPU runs a small kernel
# in tens of milliseconds, so a few trials show the rules run without making CI slow.
DEFAULT_WARMUP = {"cuda": 10, "cpu": 1}
# On an H200 ten warm-ups of a pointwise kernel of tens of microseconds were too few to bring
# an idle GPU's clocks up (bench/NOTES.md, the evaluator's timing, prediction 1): at least
# 100 ms of calls come first (triton's do_bench warms up for 25 ms).
DEFAULT_WARMUP_MS = {"cuda": 100.0, "cpu": 0.0}
DEFAULT_TRIALS = {"cuda": 100, "cpu": 3}
# The timed trials of a long call stop once they add up to this much (never under MIN_TRIALS):
# a 10 ms kernel's median is as steady after 50 calls as after 100, and a candidate of a
# gigabyte problem spent 3-7 s in timing (bench/NOTES.md, 2026-12-06, 02:40-03:02 UTC).
TIMED_MS = 500.0
MIN_TRIALS = 10
# Of the timed trials, this many, drawn at random by the judge and never told to the candidate,
# have their outputs and inputs checked (every warm-up call's are): a candidate moves the median
# only by being fast on over half its trials, and one wrong on half of them escapes 20 random
# checks with a chance of one in a million. A wrong call on copies it changed stays wrong: the
# rotation hands the same copies back, and the next checked call finds them changed. Checking
# every timed call read a call's inputs twice beside the kernel's one read: at the sizes of
# KernelBench's level 1 more than the kernel's own traffic.
CHECKED_TRIALS = 20
# A candidate whose warm-up calls ran over this many times its site's best time (`race_ms`) is
# timed MIN_TRIALS times, and so is its reference: it cannot win, and a full count would only
# pin down by how much it loses. Most of a search's candidates lose, and at KernelBench's sizes
# a full count was most of a candidate's judging (bench/NOTES.md, "2026-12-07, 18:06-"). A
# margin, not a tie: a 10-call median of a long kernel is steady to a percent or two.
RACE_MARGIN = 1.25


def default_device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


@dataclass
class EvalConfig:
    """How a candidate is judged. The trust rules themselves cannot be switched off here.

    `seeds` seed the models' parameters (the first) and number the trials; the inputs of each
    trial are drawn from `input_seed` plus the trial's seed, `input_seed` drawn at random for
    every evaluation unless it is set (to reproduce a verdict): answers prepared for known seeds
    meet inputs nobody knew."""

    device: str = field(default_factory=default_device)
    seeds: tuple[int, ...] = (0, 1, 2)
    input_seed: int | None = None
    warmup: int | None = None
    trials: int | None = None
    time: bool = True
    tolerance: float | None = None
    compile_timeout_s: float = 180.0
    run_timeout_s: float = 120.0
    # The candidate's process's CPU seconds (load does not speed a busy loop towards it);
    # None: the two wall-clock limits together.
    cpu_timeout_s: float | None = None
    # Host memory a candidate's process may take beyond its start (and on CUDA device memory
    # beyond the judge's own); None: `core.evaluate.memory.candidate_limits` sizes it.
    candidate_memory_bytes: int | None = None
    startup_timeout_s: float = 120.0
    reverify_above: float = 10.0
    rotation_budget_bytes: int = 1 << 30
    # The device's timing lock (`core.timing.device_lock`); None: the machine's lock of the
    # worker's device, which every Kiln process shares.
    gpu_lock: str | None = None
    # Hardware counters (Nsight Compute) for the candidate after it is timed; asked for by the
    # search for its best few candidates, not for every one. ncu replays each kernel some 40
    # times and starts its own Python: seconds per candidate (bench/results/counters_h200.md).
    counters: bool = False
    counters_timeout_s: float = 120.0
    # Which GPUs (torch's indices in the launching process) evaluation workers are spread over;
    # None: every GPU torch sees.
    gpus: tuple[int, ...] | None = None
    # Device memory all the workers on one GPU may hold at once (`core.evaluate.memory`);
    # None: what the GPU has free when the first candidate is judged.
    memory_bytes: int | None = None
    # The bandwidth (TB/s) of the byte floor no timing may beat: a kernel timed under it is
    # impossible, so rejected. None: the GPU's own on CUDA (`core.profile.gpu_peaks`,
    # `GpuPeaks.impossible_seconds`), and no floor on the CPU, whose timings say nothing of a
    # GPU's (tests set a slow one to exercise the rule there).
    bandwidth_tbps: float | None = None
    # Whether fp32 matmuls may run on TF32 tensor cores, the baselines' as the candidates':
    # off, fp32 matmuls stay fp32 as PyTorch runs them by default (`tf32_for`).
    allow_tf32: bool = False
    # The best time of the candidate's site when it was sent (its baseline's, or a kernel's):
    # a candidate clearly slower than it is timed briefly (RACE_MARGIN). None: every candidate
    # timed in full.
    race_ms: float | None = None

    def __post_init__(self) -> None:
        if self.device not in DEFAULT_TRIALS:
            raise ValueError(f"device must be 'cuda' or 'cpu', not {self.device!r}")
        if len(self.seeds) < 2:
            raise ValueError("at least two seeds are needed to catch results cached across calls")
        self.seeds = tuple(self.seeds)
        if self.gpus is not None:
            self.gpus = tuple(self.gpus)
            if not self.gpus or len(set(self.gpus)) < len(self.gpus):
                raise ValueError(f"gpus must name distinct GPUs, not {self.gpus!r}")
        if self.race_ms is not None and not (math.isfinite(self.race_ms) and self.race_ms > 0):
            raise ValueError(f"race_ms must be a positive time, not {self.race_ms!r}")
        if self.memory_bytes is not None and self.memory_bytes <= 0:
            raise ValueError(f"memory_bytes must be positive, not {self.memory_bytes!r}")

    def with_counters(self) -> EvalConfig:
        """This config, asking for hardware counters, with the run's time limit grown to fit."""
        return dataclasses.replace(self, counters=True,
                                   run_timeout_s=self.run_timeout_s + self.counters_timeout_s)

    @property
    def cpu_limit_s(self) -> float:
        if self.cpu_timeout_s is not None:
            return self.cpu_timeout_s
        return self.compile_timeout_s + self.run_timeout_s

    @property
    def peaks(self) -> GpuPeaks:
        """The ceilings of the byte floors (`core.evaluate.diagnosis.byte_floor_ms`)."""
        if self.bandwidth_tbps is not None:
            return GpuPeaks().with_bandwidth(self.bandwidth_tbps * 1e12)
        return device_peaks(self.device)

    def tf32_for(self, anchors: set[str]) -> bool:
        """Whether a site's fp32 products may be TF32: its baseline's are. cuDNN's convolutions
        run fp32 as TF32 by PyTorch's default; fp32 matmuls do only when the run allows it."""
        return self.allow_tf32 or "conv" in anchors

    @property
    def floor_applies(self) -> bool:
        """Whether a timing under the byte floor is rejected as impossible."""
        return self.device == "cuda" or self.bandwidth_tbps is not None

    @property
    def warmup_count(self) -> int:
        return DEFAULT_WARMUP[self.device] if self.warmup is None else self.warmup

    @property
    def warmup_after_checks(self) -> int:
        """Warm-up calls a timing needs after the checks have called the model in the same
        process: none on the CPU, where nothing warms (no clocks, and the interpreter compiles
        nothing), unless `warmup` asks for some."""
        if self.warmup is None and self.device == "cpu":
            return 0
        return self.warmup_count

    @property
    def warmup_time_ms(self) -> float:
        return DEFAULT_WARMUP_MS[self.device]

    @property
    def trial_count(self) -> int:
        return DEFAULT_TRIALS[self.device] if self.trials is None else self.trials

    def trials_within(self, call_ms: float) -> int:
        """Timed trials for calls of `call_ms` each: `trial_count`, fewer for calls so long
        that they pass TIMED_MS first (MIN_TRIALS at least); exactly `trials` when it is set."""
        if self.trials is not None or call_ms <= 0:
            return self.trial_count
        return min(self.trial_count, max(MIN_TRIALS, math.ceil(TIMED_MS / call_ms)))

    def losing(self, call_ms: float) -> bool:
        """Whether calls of `call_ms` lose the race clearly enough to be timed briefly."""
        return self.race_ms is not None and call_ms > RACE_MARGIN * self.race_ms

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @staticmethod
    def from_dict(record: dict[str, Any]) -> EvalConfig:
        return EvalConfig(**record)
