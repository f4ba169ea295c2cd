"""A candidate clearly slower than its site's best (`EvalConfig.race_ms`) is timed briefly, and so
is its reference: MIN_TRIALS calls, not the full count. One that was only slow to warm up, or
that the search did not race, is timed in full."""

from __future__ import annotations

from pathlib import Path

import pytest

from core.evaluate import EvalConfig, Evaluator
from core.evaluate.config import MIN_TRIALS, RACE_MARGIN
from core.evaluate.evaluator import item_configs
from core.evaluate.judge_timing import raced_trials
from core.search.tree import SiteSearch

DATA = Path(__file__).parent / "data" / "evaluate"
PROBLEM = DATA / "pointwise_problem.py"
FULL = 4 * MIN_TRIALS


def recorded(times: list[float]):
    """A stand-in for the judge's trials: each call takes the next of `times` (the last one
    repeated), and every (first, last) asked for is kept."""
    asked: list[tuple[int, int]] = []

    def trials(first: int, last: int) -> list[float]:
        asked.append((first, last))
        return [times[min(i, len(times) - 1)] for i in range(first, last)]

    return trials, asked


def test_a_clear_loser_gets_the_minimum_of_trials():
    trials, asked = recorded([3.0])
    config = EvalConfig(device="cuda", trials=FULL, race_ms=2.0)
    samples, brief = raced_trials(config, [3.0, 3.0], trials)
    assert brief and asked == [(0, MIN_TRIALS)] and len(samples) == MIN_TRIALS


def test_a_candidate_within_the_margin_is_timed_in_full():
    trials, asked = recorded([2.0 * RACE_MARGIN * 0.99])
    config = EvalConfig(device="cuda", trials=FULL, race_ms=2.0)
    samples, brief = raced_trials(config, [2.0 * RACE_MARGIN * 0.99], trials)
    assert not brief and asked == [(0, FULL)] and len(samples) == FULL


def test_slow_to_warm_but_fast_when_timed_is_timed_in_full_after_all():
    trials, asked = recorded([1.0])
    config = EvalConfig(device="cuda", trials=FULL, race_ms=2.0)
    samples, brief = raced_trials(config, [9.0, 9.0, 9.0], trials)
    assert not brief
    assert asked == [(0, MIN_TRIALS), (MIN_TRIALS, FULL)] and len(samples) == FULL


def test_without_a_race_or_a_warm_up_nothing_is_cut():
    trials, asked = recorded([50.0])
    samples, brief = raced_trials(EvalConfig(device="cuda", trials=FULL), [50.0], trials)
    assert not brief and len(samples) == FULL
    samples, brief = raced_trials(EvalConfig(device="cuda", trials=FULL, race_ms=1.0), [],
                                  trials)
    assert not brief and len(samples) == FULL and asked == [(0, FULL), (0, FULL)]


def test_long_calls_raced_stop_at_the_minimum_not_below_it():
    trials, _ = recorded([400.0])
    samples, brief = raced_trials(EvalConfig(device="cuda", race_ms=100.0), [400.0], trials)
    assert brief and len(samples) == MIN_TRIALS


@pytest.mark.parametrize("race_ms", [0.0, -1.0, float("inf"), float("nan")])
def test_a_race_needs_a_positive_finite_time(race_ms):
    with pytest.raises(ValueError, match="race_ms"):
        EvalConfig(device="cpu", race_ms=race_ms)


def test_the_race_reaches_every_item_but_not_the_runs_own_config():
    config = EvalConfig(device="cpu")
    raced = item_configs(config, 3, [False, True, False], race_ms=1.5)
    assert [c.race_ms for c in raced] == [1.5] * 3 and raced[1].counters
    assert config.race_ms is None and item_configs(config, 1, False)[0].race_ms is None


def test_a_search_races_its_best_time():
    search = SiteSearch(2.5, 0.01, propose=None, evaluate=None, record=None)
    assert search.race_ms == 2.5
    assert SiteSearch(float("inf"), 0.01, propose=None, evaluate=None,
                      record=None).race_ms is None


def test_the_judge_times_a_loser_briefly_and_a_contender_in_full():
    """Real workers on the CPU: the same correct candidate raced against a time it cannot
    reach, then against one it beats."""
    source = (DATA / "good_pointwise.py").read_text()
    config = EvalConfig(device="cpu", trials=FULL, warmup=2)
    with Evaluator(config, workers=1) as evaluator:
        (lost,) = evaluator.evaluate_many([(PROBLEM, source)], race_ms=1e-6)
        (won,) = evaluator.evaluate_many([(PROBLEM, source)], race_ms=1e6)
    assert lost.correct and won.correct, (lost.reason, won.reason)
    assert lost.timing_trials == MIN_TRIALS and won.timing_trials == FULL
    assert lost.baseline_ms is not None and lost.speedup is not None
