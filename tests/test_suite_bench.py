"""The suite runner: which entries it runs, and the results table it writes."""

from __future__ import annotations

import math

import pytest

from bench.suite import DEV_PROBLEMS, DEV_SUITE, SUITE
from bench.suite_bench import Outcome, geomean, outcome_of, selected, table
from core.runtime.errors import KilnInputError


def outcome(name: str, eager: float, compiled: float, kiln: float,
            correct: bool | None = True, floor: float = 0.25) -> Outcome:
    return Outcome(name, "bf16", correct, eager, compiled, kiln, eager / kiln, 1.5, 12,
                   "triton", "", spread_ms=0.01, floor_ms=floor)


def test_only_and_skip_pick_entries_in_suite_order():
    assert selected("", "") == SUITE
    names = [item.name for item in selected("", "resnet50,gpt2,vit_b_16")]
    assert names == [item.name for item in SUITE if not item.is_builtin]
    assert [item.name for item in selected("softmax,layer_norm", "layer_norm")] == ["softmax"]


def test_the_development_set_is_every_kernelbench_problem_as_written():
    assert selected("", "", "dev") == DEV_SUITE
    assert len(DEV_SUITE) == len(list(DEV_PROBLEMS.glob("level*/*.py"))) == 45
    assert len({item.name for item in DEV_SUITE + SUITE}) == len(DEV_SUITE) + len(SUITE)
    softmax = selected("l1_23_Softmax", "")[0]
    assert softmax.problem_file == DEV_PROBLEMS / "level1" / "23_Softmax.py"
    assert softmax.dtype == "fp32" and softmax.expects == ()
    levels = [item.name.split("_")[0] for item in DEV_SUITE]
    assert levels == sorted(levels), "the set runs level by level"


def test_an_unknown_name_is_refused_with_the_choices():
    with pytest.raises(KilnInputError, match="no entry 'resnet5'") as error:
        selected("", "resnet5")
    assert "resnet50" in str(error.value.fix)


def test_the_table_compares_against_the_faster_baseline_and_means_over_runs_that_ran():
    rows = [outcome("a", eager=2.0, compiled=1.0, kiln=0.5),   # 2x the faster (compile)
            outcome("b", eager=1.0, compiled=4.0, kiln=2.0, floor=1.0),  # 0.5x the faster
            Outcome("c", "fp32", None, math.nan, math.nan, math.nan, math.nan, 0.2, 0, "-",
                    "failed (1): out of memory")]
    text = table(rows)
    assert ("| a | bf16 | correct | 2.0000 | 1.0000 | 0.5000 | 0.0100 | 4.00x | 2.00x | 2.00x "
            "| 0.2500 | 4.00x |") in text
    assert ("| b | bf16 | correct | 1.0000 | 4.0000 | 2.0000 | 0.0100 | 0.50x | 2.00x | 0.50x "
            "| 1.0000 | 1.00x |") in text
    assert "| c | fp32 | failed |" in text and "out of memory" in text
    # Over a and b only: vs eager sqrt(4 * 0.5), vs compile 2, vs the faster sqrt(2 * 0.5).
    # The faster over the floor: a's 1.0 over 0.25, b's 1.0 over 1.0, so sqrt(4 * 1).
    assert "Geometric mean over 2 entries: 1.414x vs eager, 2.000x vs torch.compile, " \
           "1.000x vs the faster of the two; the faster over the floor 2.000x" in text


def test_geomean_ignores_what_did_not_run():
    assert geomean([2.0, 8.0, math.nan]) == pytest.approx(4.0)
    assert math.isnan(geomean([]))


def test_a_run_whose_end_to_end_check_failed_is_a_row_that_says_so():
    item = selected("softmax", "")[0]
    searched = [{"id": "site-a", "evaluations": 7, "best": {"tier": "triton"}}]
    failed = outcome_of(item.name, item.dtype,
                        {"e2e": {"error": "CUDA out of memory"}, "searched": searched}, 2.0)
    assert failed.correct is None and failed.tried == 7
    assert "end to end not done: CUDA out of memory" in failed.note
    skipped = outcome_of(item.name, item.dtype,
                         {"e2e": None, "searched": searched, "failure": ""}, 2.0)
    assert "no end-to-end check" in skipped.note
    assert "| softmax |" in table([failed, skipped])


def test_the_models_floor_bounds_what_kernels_could_give():
    report = {"searched": [{"id": "site-a", "evaluations": 3, "best": {"tier": "cuda"}}],
              "floor_ms": 2.0, "sites": [{"floor_ms": 1.5}, {"floor_ms": 0.5}],
              "e2e": {"correct": True, "eager_ms": 5.0, "compile_ms": 4.0, "optimized_ms": 2.5,
                      "predicted_speedup": 1.8, "installed": ["site-a"], "removed": {},
                      "spread_ms": 0.02}}
    row = outcome_of("l1_x", "fp32", report, 10.0)
    assert row.floor_ms == pytest.approx(2.0)
    assert row.headroom == pytest.approx(2.0) and row.vs_best == pytest.approx(1.6)
    assert "| 2.0000 | 2.00x |" in table([row])
