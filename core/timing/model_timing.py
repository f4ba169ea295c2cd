"""Time a reference or candidate model by the evaluator's rules, on top of `core.timing.timer`.

Before every trial the device is synchronized (nothing left over from the last trial runs inside
this one), the L2 cache is flushed by reading a buffer twice its size, and the next of several
copies of the inputs is selected, so no trial finds its operands already cached. Reference and
candidate are timed by the same code in the same process.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from core.timing.timer import (
    SITE_QUEUE_MARGIN_MS,
    QueueAhead,
    TimingStats,
    synchronize,
    time_callable,
    warm_up,
)

# The flush buffer is twice the L2 size: H200's L2 is 60 MiB, so 120 MiB.
FLUSH_FACTOR = 2
# Input sets a timing rotates through, at most. The flush before every call is what keeps a
# call's operands out of the L2; the rotation adds that no call gets the buffers of the call
# before. Covering the L2 twice over with copies of a few-kilobyte input took over ten thousand
# sets, each a guarded copy and a reference output for the evaluator, and seconds a candidate
# (bench/NOTES.md, 2026-12-05 09:10-09:20 UTC).
MAX_ROTATION_SETS = 8


def input_bytes(inputs: list[object]) -> int:
    return sum(t.numel() * t.element_size() for t in inputs if isinstance(t, torch.Tensor))


def l2_size(device: torch.device) -> int:
    if device.type != "cuda":
        return 0
    return int(torch.cuda.get_device_properties(device).L2_cache_size)


def rotation_copies(inputs: list[object], device: torch.device, budget_bytes: int) -> int:
    """How many input copies cover the L2 twice over, within `budget_bytes` of extra memory and
    `MAX_ROTATION_SETS`."""
    size = max(input_bytes(inputs), 1)
    wanted = math.ceil(FLUSH_FACTOR * l2_size(device) / size)
    return max(1, min(wanted, budget_bytes // size, MAX_ROTATION_SETS))


def rotation_sets(pristine: list[object], device: torch.device, budget_bytes: int
                  ) -> list[list[object]]:
    """`pristine` and as many copies as `rotation_copies` allows: the input sets a timing
    rotates through. One set for inputs as large as the L2 or larger, so that timing a
    gigabyte problem holds its inputs once."""
    copies = rotation_copies(pristine, device, budget_bytes)
    return [pristine] + [clone_inputs(pristine) for _ in range(copies - 1)]


def make_flush(device: torch.device) -> Callable[[], None]:
    if device.type != "cuda":
        return lambda: None
    buffer = torch.zeros(FLUSH_FACTOR * l2_size(device) // 4, dtype=torch.int32, device=device)

    def flush() -> None:
        # Read, not write: a written flush leaves the L2 full of dirty lines whose write-back
        # then lands inside the timed call (with a zero_() flush a 64 MB pointwise kernel's
        # evaluations spread far past the target on an H200: bench/NOTES.md, the evaluator's
        # timing, prediction 2).
        torch.cuda.synchronize(device)
        buffer.sum()

    return flush


def clone_inputs(inputs: list[object]) -> list[object]:
    return [t.clone() if isinstance(t, torch.Tensor) else t for t in inputs]


def time_model(
    model: Callable[..., object],
    input_sets: list[list[object]],
    device: torch.device,
    warmup: int,
    trials: int,
    warmup_ms: float = 0.0,
    queue_ahead: bool = False,
    trials_within: Callable[[float], int] | None = None,
) -> TimingStats:
    """Median latency of `model(*inputs)`, rotating through `input_sets`, L2 flushed each trial.

    Warm-up lasts `warmup` calls or `warmup_ms` of wall-clock time, whichever is longer: an idle
    GPU runs at a fraction of its clock until it has been busy for a while, and a fixed handful of
    microsecond-scale calls does not get it there. Wall time, not a count derived from the
    kernel's own time: for a kernel of microseconds that count meant thousands of flushed
    calls, over a second per model, and the evaluation pool slowed to a crawl (bench/NOTES.md,
    the evaluator's timing; bench/results/evaluate_h200.md, run C). `queue_ahead`: each trial
    is queued behind a sleep on the GPU, so its time is the device's alone (`timer.QueueAhead`).
    `trials_within(ms)`: the trials for calls of `ms` each (the warm-up's wall time a call, a
    flush and a sync included), in place of `trials`.
    """
    flush = make_flush(device)
    position = [0]

    def before_each() -> None:
        position[0] = (position[0] + 1) % len(input_sets)
        flush()

    def call() -> None:
        model(*input_sets[position[0]])

    queue = QueueAhead(device, SITE_QUEUE_MARGIN_MS) if queue_ahead else None
    with torch.no_grad():
        call_ms = warm_up(call, device, warmup, warmup_ms, before_each, queue)
        if trials_within is not None and call_ms:
            trials = trials_within(call_ms)
        stats = time_callable(call, device, warmup=0, trials=trials, before_each=before_each,
                              queue=queue)
    synchronize(device)
    return stats
