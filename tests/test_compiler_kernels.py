"""The kernel compiler's Triton backend against PyTorch: every case of `compiler_cases`, each
written under several schedules (its drafts, looped, and split over programs) and run under the
Triton interpreter."""

from __future__ import annotations

import pytest

from generators.triton.program import write_program
from tests.compiler_cases import (
    ALL_CASES,
    ARG_CASES,
    ELEMENTWISE_CASES,
    FUSED_CASES,
    LOSS_CASES,
    NORM_CASES,
    REDUCTION_CASES,
    SCAN_CASES,
    WINDOW_CASES,
    Case,
    check,
)

# Masked lanes beyond a row's end compute on zeros (log(0), 0 / 0) before the mask drops them.
pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")


def _ids(cases: list[Case]) -> list[str]:
    return [case.id for case in cases]


@pytest.mark.parametrize("case", REDUCTION_CASES, ids=_ids(REDUCTION_CASES))
def test_reductions_over_any_axes(tmp_path, case):
    check(tmp_path / "site", case, write_program)


@pytest.mark.parametrize("case", FUSED_CASES, ids=_ids(FUSED_CASES))
def test_fused_reductions_in_every_dtype(tmp_path, case):
    check(tmp_path / "site", case, write_program)


@pytest.mark.parametrize("case", ARG_CASES, ids=_ids(ARG_CASES))
def test_arg_reductions_take_the_first_extreme(tmp_path, case):
    check(tmp_path / "site", case, write_program)


@pytest.mark.parametrize("case", SCAN_CASES, ids=_ids(SCAN_CASES))
def test_scans(tmp_path, case):
    check(tmp_path / "site", case, write_program)


@pytest.mark.parametrize("case", NORM_CASES, ids=_ids(NORM_CASES))
def test_norms_and_their_epilogues(tmp_path, case):
    check(tmp_path / "site", case, write_program)


@pytest.mark.parametrize("case", LOSS_CASES, ids=_ids(LOSS_CASES))
def test_losses_over_a_whole_tensor(tmp_path, case):
    check(tmp_path / "site", case, write_program)


@pytest.mark.parametrize("case", ELEMENTWISE_CASES, ids=_ids(ELEMENTWISE_CASES))
def test_elementwise_chains_and_broadcasts(tmp_path, case):
    check(tmp_path / "site", case, write_program)


@pytest.mark.parametrize("case", WINDOW_CASES, ids=_ids(WINDOW_CASES))
def test_pooling_and_depthwise_convolution_windows(tmp_path, case):
    check(tmp_path / "site", case, write_program)


@pytest.mark.gpu
@pytest.mark.parametrize("case", ALL_CASES, ids=_ids(ALL_CASES))
def test_every_case_matches_pytorch_on_the_gpu(tmp_path, case):
    check(tmp_path / "site", case, write_program, device="cuda")
