"""Inputs crossing from the judge to a candidate's process: a buffer's memory crosses once, later
calls name it by number, and the candidate's process sees the judge's later writes to it."""

from __future__ import annotations

import os

import pytest
import torch

from core.evaluate.exchange import CandidateSide, JudgeSide
from core.evaluate.transport import PAGE, TransportError


def hand_in(judge: JudgeSide, candidate: CandidateSide, values: list[object]
            ) -> tuple[list[object], list[dict]]:
    """As a message does: the candidate's process gets duplicates of the judge's descriptors,
    and a region it maps owns its descriptor."""
    records, fds = judge.encode_inputs(values)
    received = [os.dup(fd) for fd in fds]
    loaded = [candidate.load_input(r, received) for r in records]
    mapped = {r["fd"] for r in records if "fd" in r}
    for index, fd in enumerate(received):
        if index not in mapped:
            os.close(fd)
    return loaded, records


def test_a_buffer_crosses_once_and_then_goes_by_number():
    judge, candidate = JudgeSide(), CandidateSide(torch.device("cpu"))
    shared = judge.shared_copy(torch.arange(6.0).reshape(2, 3), "input 0")
    (first,), (first_record,) = hand_in(judge, candidate, [shared])
    assert "fd" in first_record and torch.equal(first, torch.arange(6.0).reshape(2, 3))
    shared.tensor.fill_(7.0)  # the judge refills the buffer for a later call
    (again,), (again_record,) = hand_in(judge, candidate, [shared])
    assert "fd" not in again_record, f"the buffer's memory was sent again: {again_record}"
    assert torch.equal(again, torch.full((2, 3), 7.0))
    assert again.data_ptr() == first.data_ptr()


def test_a_copy_with_a_lead_holds_its_data_a_page_further_in():
    """A trial's copies made in memory just freed by the trial before: the data lies elsewhere
    than the earlier copies' did, between bands as whole as ever."""
    judge, candidate = JudgeSide(), CandidateSide(torch.device("cpu"))
    source = torch.arange(6.0)
    plain, led = judge.shared_copy(source, "input 0"), judge.shared_copy(source, "input 0", PAGE)
    assert plain.buffer is not None and led.buffer is not None
    assert led.buffer.data_start == plain.buffer.data_start + PAGE
    assert led.buffer.backing.numel() == plain.buffer.backing.numel() + PAGE
    assert led.buffer.changed_guard_bytes() == 0
    (value,), _ = hand_in(judge, candidate, [led])
    assert torch.equal(value, source)


def test_a_forgotten_buffer_crosses_again():
    judge, candidate = JudgeSide(), CandidateSide(torch.device("cpu"))
    shared = judge.shared_copy(torch.ones(5), "input 0")
    hand_in(judge, candidate, [shared])
    judge.forget(shared)
    candidate.forget(judge.take_dropped())
    (value,), (record,) = hand_in(judge, candidate, [shared])
    assert "fd" in record and torch.equal(value, torch.ones(5))


def test_a_candidates_process_lets_go_of_buffers_the_judge_forgets_when_asked():
    """The judge asks before it allocates new copies (on a GPU, shared memory stays allocated
    until both sides have let go)."""
    from core.evaluate.runner import Runner

    judge = JudgeSide()
    runner = Runner(None, torch.device("cpu"))  # type: ignore[arg-type]
    shared = judge.shared_copy(torch.ones(5), "input 0")
    hand_in(judge, runner.side, [shared])
    assert shared.number in runner.side.inputs
    judge.forget(shared)
    reply = runner.handle({"op": "forget", "numbers": judge.take_dropped()}, [])
    assert reply == ({"type": "forgotten"}, [])
    assert shared.number not in runner.side.inputs
    with pytest.raises(TransportError, match="never handed in"):
        runner.side.load_input({"t": "tensor", "number": shared.number}, [])


def test_a_number_never_handed_in_is_a_transport_error():
    candidate = CandidateSide(torch.device("cpu"))
    with pytest.raises(TransportError, match="input buffer 3 was never handed in"):
        candidate.load_input({"t": "tensor", "number": 3}, [])
