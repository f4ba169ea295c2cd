"""The compiler's schedules: a looped kernel whose rows are walked twice and whose input is
larger than L2 is first tried with one program per SM striding over the rows, so that a row's
second walk reads it from L2; the search moves that setting one rung at a time."""

from __future__ import annotations

import pytest

from generators.codegen import SM_COUNT_LINE
from generators.compiler.schedule import Schedule, drafts
from generators.compiler.site import program_of
from generators.mutations import neighbours
from generators.rules import RulesGenerator
from generators.site_graph import load_site_graph
from generators.triton.program import write_compiled
from tests.kernel_checks import one_input_problem

NORM = "x / torch.norm(x, p=2, dim=1, keepdim=True)"


def main_drafts(problem) -> list[tuple[Schedule, str]]:
    program = program_of(load_site_graph(problem))
    main = max(program.steps, key=lambda step: step.kernel.row_count * step.kernel.column_count)
    return drafts(main.kernel)


@pytest.mark.parametrize(("body", "shape", "strided"), [
    (NORM, "(4096, 65535)", True),  # 1 GB, each row walked for its norm, then for the outputs
    ("torch.softmax(x, dim=-1)", "(8192, 70000)", True),
    # 1.5 MB a row: a row on each SM is already more than L2 holds
    ("torch.softmax(x, dim=-1)", "(512, 393216)", False),
    (NORM, "(64, 65535)", False),  # 16 MB: L2 holds every row in flight already
    ("x.sum(dim=-1)", "(4096, 65535)", False),  # one walk a row: nothing to find in L2
])
def test_rows_walked_twice_beyond_l2_stride_one_program_per_sm(tmp_path, body, shape, strided):
    problem = one_input_problem(tmp_path, body, f"torch.randn{shape}")
    schedules = main_drafts(problem)
    first, why = schedules[0]
    assert (first.resident_per_sm == 1) is strided, schedules
    if strided:
        assert "L2" in why and first.block_columns < 65535
        assert all(s.resident_per_sm == 0 for s, _ in schedules[1:])


def test_a_strided_candidate_counts_the_sms_and_loops_over_its_blocks(tmp_path):
    problem = one_input_problem(tmp_path, NORM, "torch.randn(4096, 65535)")
    source = write_compiled(load_site_graph(problem), Schedule(1, 4096, 16, resident_per_sm=1))
    assert f"device = in0.device\n        {SM_COUNT_LINE}" in source
    assert "[(min(4096, 1 * sms), 1)]" in source and "PASSES=-(-4096 // min(4096, 1 * sms))" \
        in source
    assert "for each" in source and "in range(PASSES):" in source
    proposals = RulesGenerator().propose(problem, None, n=3).children
    assert proposals[0].settings["resident_per_sm"] == 1, [p.rationale for p in proposals]


def test_the_search_moves_the_programs_per_sm_a_rung_at_a_time():
    ones = {s.settings.resident_per_sm for s in neighbours(Schedule(resident_per_sm=1))
            if s.knob == "resident_per_sm"}
    assert ones == {2}
    everyone = [s for s in neighbours(Schedule()) if s.knob == "resident_per_sm"]
    assert [s.settings.resident_per_sm for s in everyone] == [4]
    assert "L2" in everyone[0].rationale
