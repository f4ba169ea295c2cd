"""The verdict on one candidate: the record the CLI prints, the search ranks and the store keeps."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any


class Reason(StrEnum):
    """Why a candidate was not accepted; `ACCEPTED` (empty) only when it was: correct, and
    faster than the PyTorch reference it was timed against."""

    ACCEPTED = ""
    # Correct, every check passed, but not faster (or not timed): a kernel to refine, not to keep.
    SLOWER = "slower"
    NOT_TIMED = "not_timed"
    NO_MODEL_NEW = "no_model_new"
    STATIC_CHECK = "static_check"
    COMPILE_ERROR = "compile_error"
    INIT_ERROR = "init_error"
    RUNTIME_ERROR = "runtime_error"
    NO_KERNEL_LAUNCHED = "no_kernel_launched"
    TORCH_COMPUTE = "torch_compute"
    LIBRARY_OP_NOT_ALLOWED = "library_op_not_allowed"
    OUTPUT_STRUCTURE = "output_structure"
    SHAPE_MISMATCH = "shape_mismatch"
    DTYPE_MISMATCH = "dtype_mismatch"
    NAN_INF = "nan_inf"
    UNWRITTEN_OUTPUT = "unwritten_output"
    OUT_OF_BOUNDS_WRITE = "out_of_bounds_write"
    WRONG_VALUES = "wrong_values"
    MUTATED_INPUT = "mutated_input"
    CACHED_RESULT = "cached_result"
    WRONG_AFTER_TIMING = "wrong_after_timing"
    SPEEDUP_NOT_REPRODUCED = "speedup_not_reproduced"
    # Timed faster than its inputs and outputs can move at the device's bandwidth: impossible.
    BELOW_FLOOR = "below_floor"
    NEEDS_GPU = "needs_gpu"
    OUT_OF_MEMORY = "out_of_memory"
    # The evaluator's own work failed, not the candidate: it was not judged.
    JUDGE_OUT_OF_MEMORY = "judge_out_of_memory"
    JUDGE_ERROR = "judge_error"
    CUDA_ERROR = "cuda_error"
    CRASH = "crash"
    TIMEOUT = "timeout"


@dataclass
class Verdict:
    """Everything the evaluator learned about one candidate on one problem.

    `correct`: it passed every check; `accepted`: correct and faster than the PyTorch
    reference it was timed against (`speedup` > 1), else `reason_code` is SLOWER or NOT_TIMED.

    `max_rel_err` is the largest `|out - ref| / (scale + |ref|)` over all trials, where `scale` is
    the reference output's largest magnitude; the candidate is correct when it stays within
    `tolerance`. Latencies are medians in milliseconds on `timing_device`. `kernel_report` is what
    the compiler made of the candidate's kernels (`core.evaluate.kernel_report.KernelReport` as a
    dict), `counters` the hardware counters Nsight Compute read for it when they were asked for
    (`core.evaluate.counters.CounterReport` as a dict), and `diagnosis` the one line
    `core.evaluate.diagnosis` drew from them and the timing.
    """

    compiled: bool = False
    correct: bool = False
    accepted: bool = False
    reason: str = ""
    reason_code: Reason = Reason.ACCEPTED
    tier: str = ""
    max_abs_err: float | None = None
    max_rel_err: float | None = None
    tolerance: float | None = None
    tolerance_name: str = ""
    trials_checked: list[str] = field(default_factory=list)
    latency_ms: float | None = None
    latency_mean_ms: float | None = None
    latency_min_ms: float | None = None
    latency_max_ms: float | None = None
    latency_stdev_ms: float | None = None
    timing_trials: int = 0
    baseline_ms: float | None = None
    speedup: float | None = None
    timing_device: str = ""
    flagged: bool = False
    library_ops: list[str] = field(default_factory=list)
    kernel_launches: int = 0
    compile_log: str = ""
    crashed: bool = False
    timed_out: bool = False
    eval_seconds: float = 0.0
    # Seconds spent in each phase of judging: compile (import, build and the first trial, which
    # compiles the kernels), checks, timing, counters; and waiting for a worker or its start.
    phase_seconds: dict[str, float] = field(default_factory=dict)
    peak_memory_bytes: int | None = None  # the worker's device memory at its peak, CUDA only
    kernel_report: dict[str, Any] | None = None
    counters: dict[str, Any] | None = None
    diagnosis: str = ""

    def to_dict(self) -> dict[str, Any]:
        record = dataclasses.asdict(self)
        record["reason_code"] = str(self.reason_code)
        return record

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), allow_nan=False)

    @staticmethod
    def from_dict(record: dict[str, Any]) -> Verdict:
        known = {f.name for f in dataclasses.fields(Verdict)}
        unknown = set(record) - known
        if unknown:
            raise ValueError(f"unknown verdict fields: {sorted(unknown)}")
        values = dict(record)
        values["reason_code"] = Reason(values.get("reason_code", ""))
        return Verdict(**values)

    @staticmethod
    def from_json(text: str) -> Verdict:
        return Verdict.from_dict(json.loads(text))

    @staticmethod
    def rejected(code: Reason, reason: str, **fields: Any) -> Verdict:
        if code is Reason.ACCEPTED or not reason:
            raise ValueError("a rejection needs a reason code and a reason")
        return Verdict(reason_code=code, reason=reason, **fields)
