"""Of the timed trials, CHECKED_TRIALS drawn at random have their outputs and inputs checked: a
candidate that bets on calls nobody looks at is still caught, and a correct one passes."""

from __future__ import annotations

from pathlib import Path

import pytest

from core.evaluate import EvalConfig, Evaluator
from core.evaluate.config import CHECKED_TRIALS
from core.evaluate.judge_timing import spot_checks
from core.evaluate.verdict import Reason, Verdict

DATA = Path(__file__).parent / "data" / "evaluate"
PROBLEM = DATA / "pointwise_problem.py"
# Three times the checked trials: two in three timed calls are not looked at.
TRIALS = 3 * CHECKED_TRIALS


def test_the_checked_trials_are_a_random_few_of_many_and_all_of_a_handful():
    drawn = spot_checks(100)
    assert len(drawn) == CHECKED_TRIALS and drawn <= set(range(100))
    assert spot_checks(100) != drawn  # a fixed choice would be one a candidate could learn
    assert spot_checks(5) == set(range(5))


@pytest.fixture(scope="module")
def verdicts() -> dict[str, Verdict]:
    names = ["bad_wrong_on_alternate_timed_calls", "bad_mutates_input_when_timed",
             "good_pointwise"]
    config = EvalConfig(device="cpu", trials=TRIALS)
    with Evaluator(config, workers=2) as evaluator:
        results = evaluator.evaluate_many([(PROBLEM, (DATA / f"{n}.py").read_text())
                                           for n in names])
    return dict(zip(names, results, strict=True))


def test_wrong_on_half_the_timed_calls_is_caught_by_the_random_checks(verdicts):
    verdict = verdicts["bad_wrong_on_alternate_timed_calls"]
    assert verdict.reason_code is Reason.WRONG_AFTER_TIMING, verdict.reason
    assert "wrong while being timed (timed call" in verdict.reason


def test_inputs_changed_on_unchecked_calls_are_found_at_the_next_checked_one(verdicts):
    verdict = verdicts["bad_mutates_input_when_timed"]
    assert verdict.reason_code is Reason.MUTATED_INPUT, verdict.reason
    assert "timed call" in verdict.reason and "changed in place" in verdict.reason


def test_a_correct_candidate_passes_all_its_trials(verdicts):
    verdict = verdicts["good_pointwise"]
    assert verdict.correct, verdict.reason
    assert verdict.timing_trials == TRIALS
