"""Long calls are timed fewer times: the trials stop once they add up to TIMED_MS, never under
MIN_TRIALS; a trial count the user sets is kept exactly."""

from __future__ import annotations

import time

import pytest
import torch

from core.evaluate.config import MIN_TRIALS, TIMED_MS, EvalConfig
from core.timing.model_timing import time_model


@pytest.mark.parametrize(("call_ms", "trials"), [(0.01, 100), (1.0, 100), (10.0, 50),
                                                 (TIMED_MS, MIN_TRIALS), (0.0, 100)])
def test_trials_on_a_gpu_stop_at_the_timed_budget(call_ms, trials):
    assert EvalConfig(device="cuda").trials_within(call_ms) == trials


def test_a_trial_count_that_is_set_is_kept_and_the_cpu_keeps_its_few():
    assert EvalConfig(device="cuda", trials=7).trials_within(100.0) == 7
    assert EvalConfig(device="cuda", trials=200).trials_within(100.0) == 200
    assert EvalConfig(device="cpu").trials_within(0.5) == 3


class Sleeper(torch.nn.Module):
    def forward(self, x):
        time.sleep(0.02)
        return x + 1


def test_a_timing_asks_for_its_trials_with_the_warm_ups_time_a_call():
    asked: list[float] = []

    def trials_within(call_ms: float) -> int:
        asked.append(call_ms)
        return 4

    stats = time_model(Sleeper(), [[torch.ones(8)]], torch.device("cpu"), warmup=1, trials=50,
                       warmup_ms=100.0, trials_within=trials_within)
    assert stats.trials == 4
    (call_ms,) = asked
    assert 20.0 <= call_ms < 60.0, call_ms
    untouched = time_model(Sleeper(), [[torch.ones(8)]], torch.device("cpu"), warmup=0,
                           trials=2, trials_within=trials_within)
    assert untouched.trials == 2 and len(asked) == 1  # no warm-up time: nothing to go by


class Counter(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        return x + 1


def test_a_warm_up_of_calls_alone_makes_exactly_that_many_before_the_trials():
    """The reference's warm-up right after its candidate's timing (the GPU already busy)."""
    model = Counter()
    stats = time_model(model, [[torch.ones(8)]], torch.device("cpu"), warmup=7, trials=5,
                       trials_within=lambda call_ms: 4)
    assert stats.trials == 4 and model.calls == 7 + 4


def test_a_warm_up_lasts_its_calls_and_its_time_whichever_is_longer():
    starts: list[float] = []

    class Slow(torch.nn.Module):
        def forward(self, x):
            starts.append(time.perf_counter())
            time.sleep(0.02)
            return x

    time_model(Slow(), [[torch.ones(8)]], torch.device("cpu"), warmup=2, trials=1,
               warmup_ms=100.0)
    *warm, trial = starts
    assert len(warm) > 2  # the time outlasted the two calls
    assert warm[-1] - warm[0] < 0.1 and trial - warm[0] > 0.099  # and it stopped once over
