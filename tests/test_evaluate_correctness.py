"""Correctness rules on plain tensors: tolerances relative to scale, NaN/Inf, shape, dtype,
poisoned and guarded allocations, input mutation; and captured inputs checked end to end."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from core.evaluate import EvalConfig, Evaluator, correctness
from core.evaluate.correctness import (
    TOLERANCES,
    changed_inputs,
    compare_outputs,
    fingerprint,
    tolerance_name,
)
from core.evaluate.guard import Guard, guarded_copy, poison_mask
from core.evaluate.verdict import Reason

DATA = Path(__file__).parent / "data" / "evaluate"
FP32 = {torch.float32: ("fp32", TOLERANCES["fp32"])}


def test_an_all_zero_answer_to_a_tiny_output_is_wrong():
    reference = torch.randn(64) * 1e-6
    comparison = compare_outputs(torch.zeros(64), reference, FP32)
    assert comparison.mismatch is not None
    assert comparison.mismatch.code is Reason.WRONG_VALUES
    assert comparison.max_rel_err > TOLERANCES["fp32"]


def test_rounding_noise_within_the_fp32_tolerance_passes_and_is_reported():
    torch.manual_seed(0)
    reference = torch.randn(1000)
    candidate = reference * (1 + 2e-5)
    comparison = compare_outputs(candidate, reference, FP32)
    assert comparison.mismatch is None
    assert 0 < comparison.max_rel_err < TOLERANCES["fp32"]
    assert comparison.max_abs_err == pytest.approx(float((candidate - reference).abs().max()))


def test_a_mismatch_message_shows_where_and_what_differs():
    reference = torch.arange(12.0).reshape(3, 4)
    candidate = reference.clone()
    candidate[2, 1] += 1.0
    mismatch = compare_outputs(candidate, reference, FP32).mismatch
    assert mismatch is not None
    assert "1 of 12 elements" in mismatch.message
    assert "(2, 1)" in mismatch.message
    assert "got 10, expected 9" in mismatch.message


def test_nan_and_inf_must_match_the_reference_exactly():
    reference = torch.tensor([1.0, float("nan"), float("inf")])
    assert compare_outputs(reference.clone(), reference, FP32).mismatch is None
    wrong_inf = torch.tensor([1.0, float("nan"), float("-inf")])
    extra_nan = torch.tensor([float("nan"), float("nan"), float("inf")])
    for candidate in (wrong_inf, extra_nan):
        mismatch = compare_outputs(candidate, reference, FP32).mismatch
        assert mismatch is not None and mismatch.code is Reason.NAN_INF


@pytest.mark.parametrize(
    ("candidate", "code"),
    [
        (torch.zeros(2, 3), Reason.SHAPE_MISMATCH),
        (torch.zeros(3, 2, dtype=torch.float64), Reason.DTYPE_MISMATCH),
        ((torch.zeros(3, 2), torch.zeros(1)), Reason.OUTPUT_STRUCTURE),
    ],
)
def test_shape_dtype_and_structure_are_checked(candidate, code):
    mismatch = compare_outputs(candidate, torch.zeros(3, 2), FP32).mismatch
    assert mismatch is not None and mismatch.code is code


def test_integer_outputs_must_match_exactly():
    mismatch = compare_outputs(torch.tensor([1, 2, 4]), torch.tensor([1, 2, 3]), {}).mismatch
    assert mismatch is not None and mismatch.code is Reason.WRONG_VALUES


@pytest.mark.parametrize(
    ("dtype", "anchors", "device", "name"),
    [
        (torch.float32, set(), "cuda", "fp32"),
        (torch.float32, {"matmul"}, "cuda", "fp32"),
        (torch.float32, {"conv"}, "cuda", "tf32"),
        (torch.float32, {"conv"}, "cpu", "fp32"),
        (torch.float16, {"matmul"}, "cuda", "fp16"),
        (torch.bfloat16, set(), "cpu", "bf16"),
        (torch.int64, set(), "cpu", "exact"),
    ],
)
def test_tolerance_names_follow_dtype_and_site(dtype, anchors, device, name):
    tf32 = EvalConfig(device="cpu").tf32_for(anchors)
    assert tolerance_name(dtype, tf32, device) == name


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.int32])
def test_fresh_allocations_are_poisoned_and_unwritten_elements_found(dtype):
    with Guard() as guard:
        out = torch.empty(10, dtype=dtype)
        out[:7] = 1
    assert poison_mask(out).tolist() == [False] * 7 + [True] * 3
    assert guard.ops["aten.empty"] == 1
    mismatch = compare_outputs(out, torch.ones(10, dtype=dtype),
                               {dtype: ("x", 1e-2)}).mismatch
    assert mismatch is not None and mismatch.code is Reason.UNWRITTEN_OUTPUT
    assert "3 of 10 elements were never written" in mismatch.message


ALLOCATIONS = {
    "aten.empty": lambda x: torch.empty(3, 5, dtype=torch.float16),
    "aten.empty channels_last": lambda x: torch.empty(2, 3, 4, 5,
                                                      memory_format=torch.channels_last),
    "aten.empty_strided": lambda x: torch.empty_strided((4, 6), (1, 4), dtype=torch.int32),
    "aten.empty_like": lambda x: torch.empty_like(x.t()),
    "aten.new_empty": lambda x: x.new_empty((7,), dtype=torch.bfloat16),
    "aten.new_empty_strided": lambda x: x.new_empty_strided((3, 2), (1, 3)),
}


@pytest.mark.parametrize("case", ALLOCATIONS)
def test_each_allocation_is_made_once_as_its_op_lays_it_out(case):
    x = torch.randn(4, 6)
    expected = ALLOCATIONS[case](x)
    made: list[tuple[str, int]] = []

    class Allocations(torch.utils._python_dispatch.TorchDispatchMode):
        """Sees each tensor made under the guard, and its bytes."""

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            result = func(*args, **(kwargs or {}))
            if isinstance(result, torch.Tensor) and result.device.type != "meta":
                made.append((str(func.overloadpacket), result.untyped_storage().nbytes()))
            return result

    with Allocations(), Guard() as guard:
        out = ALLOCATIONS[case](x)
    name = case.split()[0]
    assert (out.shape, out.stride(), out.dtype, out.device) == (
        expected.shape, expected.stride(), expected.dtype, expected.device), case
    # The guard's own buffers are made as empty tensors set onto their memory; the op's own
    # allocation would be a tensor of exactly its bytes.
    nbytes = expected.untyped_storage().nbytes()
    assert (name, nbytes) not in made, f"{case}: the op allocated beside the guard's buffer"
    assert guard.ops[name] == 1 and len(guard.buffers) == 1, (dict(guard.ops), guard.buffers)
    assert poison_mask(out).all(), case
    assert guard.out_of_bounds() == []


def test_writes_past_an_allocation_hit_its_guard_band():
    with Guard() as guard:
        out = torch.empty(16)
        past_the_end = out.as_strided((4,), (1,), out.storage_offset() + 16)
        past_the_end.fill_(0.0)
    assert guard.out_of_bounds() == [
        "16 guard bytes around allocation 0 (aten.empty) (64 bytes) were overwritten"
    ]


def test_torch_compute_and_library_ops_are_traced_separately():
    x = torch.randn(4, 4)
    with Guard() as guard:
        (x @ x).exp().reshape(-1)
    assert guard.compute_ops() == ["aten.exp"]
    assert guard.library_ops() == ["aten.mm"]


def test_input_mutation_is_found_bit_for_bit():
    original = torch.tensor([1.0, -0.0, float("nan")])
    copy, _ = guarded_copy(original, "input 0")
    assert changed_inputs([original], [copy]) is None
    copy[1] = 0.0
    mismatch = changed_inputs([original], [copy])
    assert mismatch is not None and mismatch.code is Reason.MUTATED_INPUT
    assert "1 of 3 elements differ, first at (1,)" in mismatch.message


def test_identical_outputs_are_recognised_for_cache_detection():
    a = (torch.tensor([1.0, float("nan")]), 3)
    assert fingerprint(a) == fingerprint((a[0].clone(), 3))
    assert fingerprint(a) != fingerprint((torch.tensor([1.0, 2.0]), 3))
    assert fingerprint(a) != fingerprint((a[0].clone(), 4))
    # The same bits in another order are another output.
    assert fingerprint(torch.tensor([1.0, 2.0])) != fingerprint(torch.tensor([2.0, 1.0]))


def test_a_fingerprint_taken_in_smaller_parts_is_the_same(monkeypatch):
    # Several of a comparison's pieces, of an odd length: parts of 1000 cut through each.
    x = torch.randn(2_500_017)
    whole = fingerprint(x)
    monkeypatch.setattr(correctness, "FINGERPRINT_PART", 1000)
    assert fingerprint(x) == whole
    changed = x.clone()
    changed[2_500_000] = changed[2_500_000] + 1.0
    assert fingerprint(changed) != whole


@pytest.fixture
def small_pieces(monkeypatch):
    """Comparisons walk tensors 7 elements at a time, so that small tensors span many pieces."""
    monkeypatch.setitem(correctness.CHUNK_ELEMENTS, "cpu", 7)


@pytest.mark.parametrize("layout", ["contiguous", "transposed", "sliced"])
def test_pieces_cover_every_element_once_in_order(small_pieces, layout):
    base = torch.arange(6 * 11, dtype=torch.float32).reshape(6, 11)
    tensor = {"contiguous": base, "transposed": base.t(), "sliced": base[:, 1:10:2]}[layout]
    seen = torch.cat([piece for _, (piece,) in correctness.pieces(tensor)])
    offsets = [offset for offset, _ in correctness.pieces(tensor)]
    assert torch.equal(seen, tensor.reshape(-1))
    assert all(len(piece) <= 7 for _, (piece,) in correctness.pieces(tensor))
    assert offsets == sorted(offsets) and offsets[0] == 0


def test_a_comparison_in_pieces_finds_what_a_whole_one_finds(small_pieces):
    torch.manual_seed(0)
    reference = torch.randn(5, 9).t()
    candidate = reference.clone()
    candidate[7, 3] += 1.0
    mismatch = compare_outputs(candidate, reference, FP32).mismatch
    assert mismatch is not None and mismatch.code is Reason.WRONG_VALUES
    assert "1 of 45 elements" in mismatch.message and "(7, 3)" in mismatch.message
    # The scale is the whole reference's, not a piece's: an error small against the largest
    # value passes wherever it sits.
    reference = torch.ones(40)
    reference[-1] = 1e6
    assert compare_outputs(reference + 1.0, reference, FP32).mismatch is None
    changed = reference.clone()
    changed[33] = 0.0
    assert "first at (33,)" in changed_inputs([reference], [changed]).message
    assert fingerprint(torch.arange(40.0)) != fingerprint(torch.arange(40.0).flip(0))


def test_captured_inputs_beside_a_site_problem_are_checked(tmp_path):
    site = tmp_path / "site"
    site.mkdir()
    (site / "problem.py").write_text((DATA / "pointwise_problem.py").read_text())
    captured = [torch.full((1037,), 300.0), torch.full((1037,), 2.0)]
    torch.save(captured, site / "inputs.pt")
    clipping = (DATA / "good_pointwise.py").read_text().replace(
        "x = tl.load(x_ptr + offsets, mask=mask)",
        "x = tl.minimum(tl.load(x_ptr + offsets, mask=mask), 100.0)")
    config = EvalConfig(device="cpu", time=False)
    with Evaluator(config) as evaluator:
        good, clipped = evaluator.evaluate_many([
            (site / "problem.py", (DATA / "good_pointwise.py").read_text()),
            (site / "problem.py", clipping),
        ])
    assert good.correct, good.reason
    assert "captured" in good.trials_checked
    assert clipped.reason_code is Reason.WRONG_VALUES
    assert clipped.reason.startswith("captured:")
