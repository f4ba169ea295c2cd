"""How many input sets a timing rotates through: enough to cover the L2 twice over, but never
the thousands that copies of a few-kilobyte input would take (each is a guarded copy and a
reference output for the evaluator)."""

from __future__ import annotations

import pytest
import torch

from core.timing import model_timing
from core.timing.model_timing import MAX_ROTATION_SETS, rotation_copies, rotation_sets

CUDA = torch.device("cuda")
H200_L2 = 60 * 2**20


@pytest.fixture
def h200_l2(monkeypatch):
    """The L2 size an H200 reports (this machine has no GPU to ask)."""
    monkeypatch.setattr(model_timing, "l2_size", lambda device: H200_L2)


def test_small_inputs_rotate_through_a_bounded_number_of_sets(h200_l2):
    inputs = [torch.randn(1037), torch.randn(1037)]
    assert rotation_copies(inputs, CUDA, 1 << 30) == MAX_ROTATION_SETS


def test_inputs_as_large_as_the_l2_take_one_set(h200_l2):
    inputs = [torch.empty(H200_L2 * 2 // 4)]
    assert rotation_copies(inputs, CUDA, 1 << 30) == 1


def test_mid_sized_inputs_cover_the_l2_twice(h200_l2):
    inputs = [torch.empty(H200_L2 // 2 // 4)]  # half the L2: four sets cover it twice
    assert rotation_copies(inputs, CUDA, 1 << 30) == 4


def test_the_memory_budget_bounds_the_copies(h200_l2):
    inputs = [torch.empty(H200_L2 // 8 // 4)]
    assert rotation_copies(inputs, CUDA, 2 * H200_L2 // 8) == 2


def test_the_cpu_times_on_the_inputs_themselves():
    inputs = [torch.randn(5), 3]
    sets = rotation_sets(inputs, torch.device("cpu"), 1 << 30)
    assert len(sets) == 1 and sets[0] is inputs
