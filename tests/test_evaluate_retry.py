"""The evaluator's own failures are judged again, once, on a fresh worker, before one stands as a
candidate's verdict (a judge out of device memory, alone on its GPU); inputs its process could
not map are the evaluator's failure, not the candidate's."""

from __future__ import annotations

from pathlib import Path

import pytest

from core.evaluate import EvalConfig, Evaluator
from core.evaluate.candidate import classify
from core.evaluate.exchange import HandOverFailed, handing_over
from core.evaluate.verdict import Reason

DATA = Path(__file__).parent / "data" / "evaluate"

# Its inputs fail to draw the first time the judge draws them (a file marks that it did);
# sizing the problem on the meta device does not count.
FLAKY_PROBLEM = """
from pathlib import Path

import torch
import torch.nn as nn

FAILED_ONCE = Path({mark!r})


class Model(nn.Module):
    def forward(self, x, y):
        return x * y + x


def get_inputs():
    if torch.get_default_device().type != "meta" and not FAILED_ONCE.exists():
        FAILED_ONCE.write_text("failed")
        raise {error}
    return [torch.randn(1037), torch.randn(1037)]


def get_init_inputs():
    return []
"""


# The reference's forward runs out of device memory the first time (the device full of what
# other processes hold): the judge's failure, not the candidate's.
FLAKY_FORWARD = """
from pathlib import Path

import torch
import torch.nn as nn

FAILED_ONCE = Path({mark!r})


class Model(nn.Module):
    def forward(self, x, y):
        if x.device.type != "meta" and not FAILED_ONCE.exists():
            FAILED_ONCE.write_text("failed")
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 8.00 GiB")
        return x * y + x


def get_inputs():
    return [torch.randn(1037), torch.randn(1037)]


def get_init_inputs():
    return []
"""


def flaky_problem(folder: Path, name: str = "flaky",
                  error: str = 'RuntimeError("the machine hiccuped")',
                  template: str = FLAKY_PROBLEM) -> tuple[Path, Path]:
    mark = folder / f"{name}.failed"
    path = folder / f"{name}.py"
    path.write_text(template.format(mark=str(mark), error=error))
    return path, mark


@pytest.mark.parametrize(("template", "error"), [
    (FLAKY_PROBLEM, 'RuntimeError("the machine hiccuped")'),
    # Out of device memory: judged again alone on its GPU (on the CPU, just again).
    (FLAKY_PROBLEM, 'torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 4.00 GiB")'),
    (FLAKY_FORWARD, ""),
], ids=["an error drawing inputs", "out of memory drawing inputs",
        "out of memory in the reference's forward"])
def test_a_failure_of_the_evaluators_own_is_judged_again_on_a_fresh_worker(tmp_path, template,
                                                                           error):
    problem, mark = flaky_problem(tmp_path, error=error, template=template)
    with Evaluator(EvalConfig(device="cpu", time=False), workers=1) as evaluator:
        verdict = evaluator.evaluate(problem, (DATA / "good_pointwise.py").read_text())
        replacements = evaluator.pool.replacements
    assert mark.exists(), "the first judging never failed"
    assert verdict.correct, verdict.reason
    assert replacements == 1


def test_a_failure_that_happens_twice_stands(tmp_path):
    problem, mark = flaky_problem(tmp_path)
    source = (DATA / "good_pointwise.py").read_text()
    with Evaluator(EvalConfig(device="cpu", time=False), workers=1) as evaluator:
        problem.write_text(problem.read_text().replace("not FAILED_ONCE.exists()", "True"))
        verdict = evaluator.evaluate(problem, source)
    assert verdict.reason_code is Reason.JUDGE_ERROR, verdict.reason
    assert "the machine hiccuped" in verdict.reason


def test_a_reference_out_of_memory_twice_stands_as_the_evaluators(tmp_path):
    problem = tmp_path / "always_out.py"
    problem.write_text(FLAKY_FORWARD.format(mark=str(tmp_path / "never"))
                       .replace("not FAILED_ONCE.exists()", "True"))
    with Evaluator(EvalConfig(device="cpu", time=False), workers=1) as evaluator:
        verdict = evaluator.evaluate(problem, (DATA / "good_pointwise.py").read_text())
    assert verdict.reason_code is Reason.JUDGE_OUT_OF_MEMORY, verdict.reason
    assert "ran out of device memory" in verdict.reason
    assert "Tried to allocate 8.00 GiB" in verdict.compile_log


def out_of_memory_candidate() -> str:
    """A correct kernel whose forward first asks for a petabyte of memory."""
    source = (DATA / "good_pointwise.py").read_text()
    marker = "        out = torch.empty_like(x)\n"
    assert marker in source
    return source.replace(marker, "        torch.empty(1 << 48, device=x.device)\n" + marker)


@pytest.mark.parametrize(("device", "judged_again"), [
    ("cpu", 0),
    # The device may have been full of other processes' memory: the candidate's verdict is the
    # one it gets alone on the GPU.
    pytest.param("cuda", 1, marks=pytest.mark.gpu),
], ids=["host memory: not judged again", "device memory: judged again alone"])
def test_a_candidate_out_of_memory(tmp_path, device, judged_again):
    problem, _ = flaky_problem(tmp_path)
    problem.write_text(problem.read_text().replace("not FAILED_ONCE.exists()", "False"))
    with Evaluator(EvalConfig(device=device, time=False), workers=1) as evaluator:
        verdict = evaluator.evaluate(problem, out_of_memory_candidate())
        replacements = evaluator.pool.replacements
    assert verdict.reason_code is Reason.OUT_OF_MEMORY, verdict.reason
    assert replacements == judged_again


def test_tensors_that_could_not_cross_are_the_evaluators_failure():
    text = ("HandOverFailed: receiving the inputs: AcceleratorError: CUDA error: mapping of "
            "buffer object failed")
    rejection = classify({"names": ["HandOverFailed", "RuntimeError", "Exception"],
                          "text": text, "detail": text})
    assert rejection.code is Reason.JUDGE_ERROR, rejection.reason
    assert not rejection.healthy
    assert "could not move tensors" in rejection.reason
    # The same error raised by the candidate's own forward is its CUDA error.
    own = classify({"names": ["AcceleratorError", "RuntimeError", "Exception"],
                    "text": "AcceleratorError: CUDA error: mapping of buffer object failed"})
    assert own.code is Reason.CUDA_ERROR


def test_only_an_ipc_refusal_in_a_hand_over_is_the_evaluators():
    with pytest.raises(HandOverFailed, match="sending the outputs: RuntimeError: CUDA error: "
                                             "mapping of buffer object failed"), \
            handing_over("sending the outputs"):
        raise RuntimeError("CUDA error: mapping of buffer object failed")
    # Another error there (the candidate's kernel broke the context, say) stays what it was.
    with pytest.raises(RuntimeError, match="illegal memory access") as raised, \
            handing_over("sending the outputs"):
        raise RuntimeError("CUDA error: an illegal memory access was encountered")
    assert not isinstance(raised.value, HandOverFailed)
    # Where no candidate code runs, any error is.
    with pytest.raises(HandOverFailed, match="receiving the inputs: KeyError"), \
            handing_over("receiving the inputs", every_error=True):
        raise KeyError("shape")
