"""The verdict record: JSON round trip, and rejections always carry a reason."""

from __future__ import annotations

import json

import pytest

from core.evaluate.config import EvalConfig
from core.evaluate.verdict import Reason, Verdict


def test_a_verdict_round_trips_through_json():
    verdict = Verdict(compiled=True, correct=True, accepted=True, tier="triton",
                      max_abs_err=1e-7, max_rel_err=2e-7, tolerance=1e-4, tolerance_name="fp32",
                      trials_checked=["seed 0"], latency_ms=0.5, baseline_ms=1.0, speedup=2.0,
                      library_ops=["aten.mm"], timing_device="cuda (NVIDIA H200)")
    text = verdict.to_json()
    assert json.loads(text)["reason_code"] == ""
    assert Verdict.from_json(text) == verdict


def test_a_rejection_round_trips_its_reason_code():
    verdict = Verdict.rejected(Reason.TIMEOUT, "no verdict within 3s", timed_out=True)
    again = Verdict.from_json(verdict.to_json())
    assert again.reason_code is Reason.TIMEOUT and again.timed_out and not again.accepted


def test_a_rejection_needs_a_code_and_a_reason():
    with pytest.raises(ValueError, match="needs a reason"):
        Verdict.rejected(Reason.ACCEPTED, "fine")
    with pytest.raises(ValueError, match="needs a reason"):
        Verdict.rejected(Reason.CRASH, "")


def test_unknown_fields_are_refused():
    with pytest.raises(ValueError, match="unknown verdict fields"):
        Verdict.from_dict({"accepted": True, "bogus": 1})


def test_config_defaults_depend_on_the_device_and_need_two_seeds():
    assert EvalConfig(device="cpu").trial_count == 3
    assert EvalConfig(device="cuda", trials=7).trial_count == 7
    assert EvalConfig(device="cuda").warmup_count == 10
    with pytest.raises(ValueError, match="two seeds"):
        EvalConfig(device="cpu", seeds=(0,))
    assert EvalConfig.from_dict(EvalConfig(device="cpu").to_dict()) == EvalConfig(device="cpu")


def test_a_timing_after_the_checks_warms_up_only_where_something_warms():
    assert EvalConfig(device="cpu").warmup_after_checks == 0
    assert EvalConfig(device="cpu", warmup=2).warmup_after_checks == 2
    assert EvalConfig(device="cuda").warmup_after_checks == 10
