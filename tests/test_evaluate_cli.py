"""`python -m core.evaluate`: JSON verdicts and exit codes 0 (accepted: correct and faster), 1
(rejected, or correct but slower), 2 (bad
input)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

DATA = Path(__file__).parent / "data" / "evaluate"
REPO = Path(__file__).parent.parent
PROBLEM = str(DATA / "pointwise_problem.py")


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "core.evaluate", *args], capture_output=True,
                          text=True, cwd=REPO, timeout=120, check=False)


def test_a_correct_candidate_prints_one_json_verdict_and_exits_0_only_if_faster():
    """On the CPU, the Triton interpreter is far slower than PyTorch: correct, not accepted."""
    result = run(PROBLEM, str(DATA / "good_pointwise.py"), "--device", "cpu", "--trials", "2",
                 "--seed", "5", "--json")
    verdict = json.loads(result.stdout)
    for key in ("compiled", "correct", "accepted", "reason", "max_abs_err", "max_rel_err",
                "latency_ms", "baseline_ms", "speedup"):
        assert key in verdict
    assert verdict["correct"]
    assert result.returncode == (0 if verdict["accepted"] else 1), result.stderr
    if verdict["accepted"]:
        assert verdict["reason"] == "" and verdict["speedup"] > 1
    else:
        assert verdict["reason_code"] == "slower" and verdict["speedup"] <= 1
        assert verdict["reason"].startswith("correct, but ")
    assert verdict["timing_trials"] == 2
    assert verdict["trials_checked"][:3] == ["seed 5", "seed 6", "seed 7"]


def test_counters_asked_for_on_the_cpu_say_why_there_are_none():
    result = run(PROBLEM, str(DATA / "good_pointwise.py"), "--device", "cpu", "--trials", "2",
                 "--counters")
    assert result.returncode in (0, 1), result.stderr
    assert result.stdout.startswith(("accepted", "correct, not accepted [slower]"))
    assert ("no hardware counters: hardware counters need a CUDA device; this run is on cpu"
            in result.stdout.splitlines())


def test_a_rejected_candidate_exits_1_with_the_reason():
    result = run(PROBLEM, str(DATA / "bad_stream.py"), "--device", "cpu")
    assert result.returncode == 1
    assert result.stdout.startswith("rejected [static_check]: line 20: uses torch.cuda.Stream")


def test_a_compile_error_shows_the_line():
    result = run(PROBLEM, str(DATA / "bad_syntax.txt"), "--device", "cpu", "--json")
    assert result.returncode == 1
    verdict = json.loads(result.stdout)
    assert not verdict["compiled"]
    assert verdict["compile_log"].startswith("line 17: expected ':'")


def test_bad_input_exits_2_with_one_message_and_no_traceback(tmp_path):
    not_python = tmp_path / "missing.py"
    cases = [
        (PROBLEM, str(not_python), "cannot read the candidate file"),
        (PROBLEM, str(DATA / "no_model_new.py"), "does not define ModelNew"),
        (str(DATA / "good_pointwise.py"), str(DATA / "good_pointwise.py"),
         "does not define Model, get_inputs, get_init_inputs"),
    ]
    for problem, candidate, message in cases:
        result = run(problem, candidate, "--device", "cpu")
        assert result.returncode == 2
        assert message in result.stderr
        assert "Traceback" not in result.stderr
