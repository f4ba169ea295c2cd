"""Statements of a Triton kernel's pass loop that read nothing the loop changes are moved before
it: a program striding over blocks of rows loads a norm's weight and bias once, not every pass."""

from __future__ import annotations

import pytest

from generators.compiler.schedule import Schedule
from generators.site_graph import load_site_graph
from generators.triton.hoist import invariants_hoisted
from generators.triton.program import write_compiled
from tests.kernel_checks import assert_matches, one_input_problem, run_beside_problem

LOOP = [
    "    a1 = tl.arange(0, 8)",
    "    acc2 = tl.zeros([8], tl.float32)",
    "    for each3 in range(4):",
    "        cols4 = tl.program_id(1) * 8 + a1",  # invariant
    "        w5 = tl.load(in1 + cols4)",  # invariant, through cols4
    "        rows6 = tl.program_id(0) + each3 * 2",  # reads the loop's counter
    "        x7 = tl.load(in0 + rows6 * 8 + cols4)",  # reads rows6
    "        acc2 = acc2 + x7 * w5",  # an accumulator, bound twice
    "        o8 = tl.load(out0 + cols4)",  # reads what the kernel writes
    "        for step9 in range(2):",
    "            k10 = tl.arange(0, 8)",  # in a nested loop: stays there
    "        tl.store(out0 + cols4, acc2)",
    "    tl.store(out1, tl.sum(acc2, axis=0))",
]


def test_invariant_statements_move_before_the_loop_in_their_order():
    hoisted = invariants_hoisted(LOOP, 2)
    loop = hoisted.index("    for each3 in range(4):")
    assert hoisted[:loop] == LOOP[:2] + ["    cols4 = tl.program_id(1) * 8 + a1",
                                         "    w5 = tl.load(in1 + cols4)"]
    assert hoisted[loop + 1:] == [line for line in LOOP[3:] if "cols4 =" not in line
                                  and "w5 =" not in line]


def test_a_line_that_starts_no_loop_is_refused():
    with pytest.raises(ValueError, match="starts no loop"):
        invariants_hoisted(LOOP, 1)


def test_a_strided_norm_loads_its_weight_and_bias_once_a_program(tmp_path):
    problem = one_input_problem(tmp_path, "F.layer_norm(x, (300,), w, b)",
                                "torch.randn(37, 300), torch.randn(300), torch.randn(300)",
                                "x, w, b")
    source = write_compiled(load_site_graph(problem), Schedule(1, 512, 4, resident_per_sm=2))
    lines = source.splitlines()
    loop = next(i for i, line in enumerate(lines) if "for each" in line)
    loads = {name: next(i for i, line in enumerate(lines) if f"tl.load({name} +" in line)
             for name in ("in0", "in1", "in2")}
    assert loads["in1"] < loop and loads["in2"] < loop < loads["in0"], source
    actual, expected = run_beside_problem(source, problem, seed=5)
    assert_matches(actual, expected, source)
