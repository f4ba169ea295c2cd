"""Walks follow memory: a kernel's columns and its reductions' loops go in the order their largest
input lies in memory (a channels-last tensor's channels innermost), the same order for every walk
over the same counters."""

from __future__ import annotations

from pathlib import Path

import pytest

from generators.compiler.lower import lower_problem
from generators.compiler.plan import memory_order
from generators.compiler.program import plan_program
from tests.compiler_cases import PROBLEM

GROUP_NORM = ("x, w, b", "F.group_norm(x, 4, w, b)",
              "torch.randn(2, 16, 96, 96){layout}, torch.randn(16), torch.randn(16)")
CHANNELS_LAST = ".to(memory_format=torch.channels_last)"


def kernels(tmp_path: Path, args: str, body: str, inputs: str):
    problem = tmp_path / "problem.py"
    problem.write_text(PROBLEM.format(args=args, body=body, inputs=inputs))
    return [step.kernel for step in plan_program(lower_problem(problem)).steps]


def walk(kernel) -> tuple[str, ...]:
    return tuple(kernel.symbols[d] for d in kernel.columns)


def test_a_channels_last_group_norm_walks_its_channels_innermost(tmp_path):
    args, body, inputs = GROUP_NORM
    (kernel,) = kernels(tmp_path, args, body, inputs.format(layout=CHANNELS_LAST))
    # Rows (sample, group); columns (channel in group, position): walked position-major.
    assert kernel.domain == (2, 4, 4, 9216) and walk(kernel) == ("d3", "d2")
    assert {r.walked for r in kernel.reductions} == {("d3", "d2")}
    # The loops still give one counter a reduced dimension, in the view's order: the walk
    # moves, the coordinates do not.
    assert {r.loop for r in kernel.reductions} == {("d2", "d3")}


def test_a_contiguous_group_norm_keeps_the_views_order(tmp_path):
    args, body, inputs = GROUP_NORM
    (kernel,) = kernels(tmp_path, args, body, inputs.format(layout=""))
    assert walk(kernel) == ("d2", "d3")
    assert {r.walked for r in kernel.reductions} == {("d2", "d3")}


def test_a_reductions_own_loop_over_a_channels_last_tensor_goes_along_memory(tmp_path):
    """The mean of a norm's output is a kernel of its own whose loop has counters of its own;
    its buffer is contiguous, the input of a plain sum is not."""
    found = kernels(tmp_path, "x", "x.sum(dim=(1, 2, 3)) + x.amax(dim=(1, 2, 3))",
                    f"torch.randn(3, 6, 5, 7){CHANNELS_LAST}")
    (kernel,) = found
    loops = {r.walked for r in kernel.reductions}
    assert len(loops) == 1
    (loop,) = loops
    strides = dict(zip(loop, [kernel.sizes[s] for s in loop], strict=True))
    # Channels (6) innermost, then the width (7), then the height (5).
    assert [strides[s] for s in loop] == [5, 7, 6]


@pytest.mark.parametrize("inputs", ["torch.randn(4, 6, 5)", "torch.randn(4, 1, 5).expand(4, 6, 5)"])
def test_walks_the_layout_does_not_order_stay_as_they_are(tmp_path, inputs):
    """A contiguous input is walked as viewed; a broadcast one (two counters, one of them
    at stride 0) gives no order to follow."""
    (kernel,) = kernels(tmp_path, "x", "x.sum(dim=(1, 2))", inputs)
    (loop,) = {r.walked for r in kernel.reductions}
    assert memory_order(kernel, loop) == loop
    assert [kernel.sizes[s] for s in loop] == [6, 5]
