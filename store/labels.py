"""What a verdict is called in one word, and whose timings a run's are: one rule for every listing
of the CLI and every page of the app.

`accepted` means correct and faster than the PyTorch reference the kernel was timed against. A
store written before the evaluator required that holds accepted verdicts of slower kernels:
those read as "correct, slower", as the evaluator would now judge them.
"""

from __future__ import annotations

import re

ACCEPTED = "accepted"
SLOWER = "correct, slower"
REJECTED = "rejected"  # correct, and rejected for another reason: its reason_code says which
INCORRECT = "incorrect"
COMPILE_FAILED = "compile failed"
PENDING = "pending"
SLOWER_CODE = "slower"  # core.evaluate.verdict.Reason.SLOWER

# Each label as a condition on candidates `c` and their latest verdict `v`, for filters and counts;
# `verdict_label` below gives the same answer on the same row.
VERDICT_SQL = {
    ACCEPTED: "v.accepted = 1 AND NOT coalesce(v.speedup <= 1.0, 0)",
    SLOWER: f"v.correct = 1 AND (v.reason_code = '{SLOWER_CODE}'"
    " OR (v.accepted = 1 AND v.speedup <= 1.0))",
    REJECTED: "v.correct = 1 AND v.accepted = 0"
    f" AND coalesce(v.reason_code, '') != '{SLOWER_CODE}'",
    INCORRECT: "v.compiled = 1 AND v.correct = 0",
    COMPILE_FAILED: "v.compiled = 0",
    PENDING: "c.verdict_id IS NULL",
}
VERDICTS = tuple(VERDICT_SQL)

CPU_TIMINGS = "CPU timings, indicative"


def verdict_label(
    compiled: bool | None,
    correct: bool | None,
    accepted: bool | None,
    reason_code: str | None,
    speedup: float | None,
) -> str:
    """A verdict in one of `VERDICTS`; `accepted` None means the candidate has no verdict yet."""
    if accepted is None:
        return PENDING
    slower = speedup is not None and speedup <= 1.0
    if accepted and not slower:
        return ACCEPTED
    if correct and (accepted or reason_code == SLOWER_CODE):
        return SLOWER
    if correct:
        return REJECTED
    return INCORRECT if compiled else COMPILE_FAILED


def cpu_timings(gpu: str) -> bool:
    """Whether a run's `gpu` says it ran on the CPU (the optimizer records "cpu"), so that its
    timings are the CPU's and the Triton interpreter's: indicative, not a GPU's."""
    return re.match(r"\s*cpu\b", gpu, re.IGNORECASE) is not None
