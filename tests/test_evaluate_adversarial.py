"""Broken and cheating candidates, each rejected for the right reason; good ones found correct.

Every candidate is a real module under tests/data/evaluate, judged by worker processes exactly
as an evaluation does: on the CPU under Triton's interpreter, and on a GPU where there is one.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from core.evaluate import EvalConfig, Evaluator
from core.evaluate.verdict import Reason, Verdict

DATA = Path(__file__).parent / "data" / "evaluate"
POINTWISE = "pointwise_problem"

# candidate file → (problem file, expected reason, text the reason must contain)
CASES = {
    "bad_torch_only": (POINTWISE, Reason.STATIC_CHECK, "no custom kernel"),
    "bad_torch_answer": (POINTWISE, Reason.TORCH_COMPUTE, "aten.add, aten.mul"),
    "bad_caught_exception": (POINTWISE, Reason.STATIC_CHECK, "catches exceptions"),
    "bad_stream": (POINTWISE, Reason.STATIC_CHECK, "may not touch streams"),
    "bad_thread": (POINTWISE, Reason.STATIC_CHECK, "imports threading"),
    "bad_timer_patch": (POINTWISE, Reason.STATIC_CHECK, "monkey-patch"),
    "bad_subprocess_file": (POINTWISE, Reason.STATIC_CHECK, "imports subprocess"),
    "bad_reseeds": (POINTWISE, Reason.STATIC_CHECK, "RNG seeding"),
    "bad_stale_output": (POINTWISE, Reason.UNWRITTEN_OUTPUT, "1037 of 1037 elements"),
    "bad_mutates_input": (POINTWISE, Reason.MUTATED_INPUT, "input 0 was changed in place"),
    "bad_cached_by_shape": (POINTWISE, Reason.CACHED_RESULT, "the same output as for seed"),
    "bad_cached_by_pointer": (POINTWISE, Reason.CACHED_RESULT, "cached by pointer"),
    "bad_out_of_bounds": (POINTWISE, Reason.OUT_OF_BOUNDS_WRITE, "guard bytes"),
    "bad_missing_tail": (POINTWISE, Reason.UNWRITTEN_OUTPUT, "13 of 1037 elements"),
    "bad_race": ("neighbour_sum_problem", Reason.WRONG_VALUES, "outside the fp32 tolerance"),
    "bad_wrong_dtype": ("half_problem", Reason.DTYPE_MISMATCH, "torch.float32"),
    "bad_small_error": (POINTWISE, Reason.WRONG_VALUES, "outside the fp32 tolerance 0.0001"),
    "bad_nan": (POINTWISE, Reason.NAN_INF, "NaN/Inf"),
    "bad_shape": (POINTWISE, Reason.SHAPE_MISMATCH, "(1, 1037)"),
    "bad_library_on_pointwise": (POINTWISE, Reason.LIBRARY_OP_NOT_ALLOWED, "aten.mm"),
    "bad_wrong_after_timing": (POINTWISE, Reason.WRONG_AFTER_TIMING,
                               "wrong while being timed"),
    "bad_syntax": (POINTWISE, Reason.COMPILE_ERROR, "line 17"),
    # Attribute paths to anything: the allowlist refuses them before anything runs.
    "bad_torch_os": (POINTWISE, Reason.STATIC_CHECK, "os is off limits"),
    "bad_typing_sys": (POINTWISE, Reason.STATIC_CHECK, "sys is off limits"),
    "bad_attrgetter": (POINTWISE, Reason.STATIC_CHECK, "imports operator"),
    "bad_builtins": (POINTWISE, Reason.STATIC_CHECK, "uses __builtins__"),
    "bad_module_alias": (POINTWISE, Reason.STATIC_CHECK, "uses the module torch as a value"),
    "bad_dunder_globals": (POINTWISE, Reason.STATIC_CHECK, "uses .__globals__"),
    "bad_numpy_compute": (POINTWISE, Reason.STATIC_CHECK, "uses .numpy"),
    "bad_tensor_subclass": (POINTWISE, Reason.STATIC_CHECK, "derives from torch.Tensor"),
    "bad_grid_lambda": (POINTWISE, Reason.STATIC_CHECK, "only compute a launch grid"),
    # Compute outside the kernels, caught as it runs.
    "bad_heuristic_compute": (POINTWISE, Reason.TORCH_COMPUTE, "during a kernel launch"),
    "bad_python_compute": (POINTWISE, Reason.TORCH_COMPUTE, "aten._local_scalar_dense"),
    # Inputs from a seed drawn per evaluation: answers for known seeds are wrong.
    "bad_known_seeds": (POINTWISE, Reason.WRONG_VALUES, "outside the fp32 tolerance"),
    # Bands sized to the output: a write 64 KiB past a 4 KiB output lands in one.
    "bad_far_out_of_bounds": (POINTWISE, Reason.OUT_OF_BOUNDS_WRITE, "guard bytes"),
    # An exception while timed is the candidate's verdict; the batch goes on.
    "bad_raises_when_timed": (POINTWISE, Reason.RUNTIME_ERROR, "tired of being timed"),
}
GOOD = {
    "bad_storage_offset": POINTWISE,  # its cheat never fires: timing runs the checked path
    "good_pointwise": POINTWISE,
    "good_softmax": "softmax_problem",
    "good_linear_gelu": "linear_gelu_problem",
    "good_kb_linear_relu": "kb_linear_relu_problem",
}


def item(candidate: str, problem: str) -> tuple[Path, str]:
    # A candidate that does not parse is kept as .txt so that linters leave it alone.
    path = next(p for p in (DATA / f"{candidate}.py", DATA / f"{candidate}.txt") if p.exists())
    return DATA / f"{problem}.py", path.read_text()


# A race shows under the interpreter, which runs programs one after another; on a GPU, whose
# programs run at once, it may not show in any trial: no test can promise to catch it there.
INTERPRETER_ONLY = {"bad_race"}


@pytest.fixture(scope="module", params=["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def device(request) -> str:
    return request.param


@pytest.fixture(scope="module")
def verdicts(device) -> dict[str, Verdict]:
    names = [n for n in [*CASES, *GOOD] if device == "cpu" or n not in INTERPRETER_ONLY]
    problems = [CASES[n][0] if n in CASES else GOOD[n] for n in names]
    with Evaluator(EvalConfig(device=device), workers=2) as evaluator:
        results = evaluator.evaluate_many([item(n, p) for n, p in zip(names, problems,
                                                                     strict=True)])
    return dict(zip(names, results, strict=True))


@pytest.mark.parametrize("name", sorted(CASES))
def test_broken_or_cheating_candidate_is_rejected_for_the_right_reason(verdicts, name):
    if name not in verdicts:
        pytest.skip("shows only under the interpreter")
    _, code, text = CASES[name]
    verdict = verdicts[name]
    assert not verdict.correct
    assert verdict.reason_code is code, verdict.reason
    assert text in verdict.reason


@pytest.mark.parametrize("name", sorted(GOOD))
def test_good_triton_candidate_is_correct_with_errors_and_timings(verdicts, device, name):
    """Correct, and accepted only when faster than PyTorch (never under the interpreter)."""
    verdict = verdicts[name]
    assert verdict.compiled and verdict.correct, verdict.reason
    assert verdict.accepted == (verdict.speedup > 1)
    assert verdict.accepted or verdict.reason_code is Reason.SLOWER
    assert verdict.tier == "triton"
    assert verdict.speedup < 10, "a timed cheat would show here"
    assert verdict.max_rel_err is not None and verdict.max_rel_err <= verdict.tolerance
    first = int(verdict.trials_checked[0].split()[1])
    assert verdict.trials_checked == [f"seed {first}", f"seed {first + 1}", f"seed {first + 2}",
                                      f"seed {first + 3} after timing"]
    assert verdict.latency_ms > 0 and verdict.baseline_ms > 0 and verdict.speedup > 0
    assert verdict.timing_device == ("cpu (Triton interpreter)" if device == "cpu"
                                     else f"cuda ({torch.cuda.get_device_name()})")
    assert verdict.kernel_launches >= 1


def test_library_anchor_op_is_recorded_for_a_matmul_site(verdicts):
    assert verdicts["good_linear_gelu"].library_ops == ["aten.mm"]
    assert verdicts["good_kb_linear_relu"].library_ops == []


def test_the_suite_covers_at_least_twelve_distinct_failures():
    assert len({code for _, code, _ in CASES.values()}) >= 12
