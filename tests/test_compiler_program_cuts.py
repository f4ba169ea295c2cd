"""A site too tangled for one kernel is cut where that takes the fewest kernels, then the fewest
bytes between them: at the outermost reductions that read others (a loss over rows'
log-softmaxes), at the innermost, or at the innermost reductions' own results (a group norm's
statistics, where a logsumexp or a mean over its output follows: the norm's output is never
written); and a value a buffer already holds is read from it, not computed again."""

from __future__ import annotations

from pathlib import Path

from generators.compiler.lower import lower_problem
from generators.compiler.program import plan_program
from tests.compiler_cases import PROBLEM


def program(tmp_path: Path, args: str, body: str, inputs: str):
    problem = tmp_path / "problem.py"
    problem.write_text(PROBLEM.format(args=args, body=body, inputs=inputs))
    return plan_program(lower_problem(problem))


def test_a_logsumexp_over_a_norms_channels_is_the_norms_statistics_then_one_kernel(tmp_path):
    found = program(tmp_path, "x, w, b",
                    "torch.logsumexp(x + torch.tanh(F.group_norm(x, 4, w, b)), dim=1)",
                    "torch.randn(2, 8, 6, 5), torch.randn(8), torch.randn(8)")
    norm, logsumexp = (step.kernel for step in found.steps)
    # A mean and a variance per (sample, group), not the norm's output (2 × 8 × 6 × 5 values).
    assert {v.shape for v in found.buffers.values()} == {(2, 4, 1, 1)}
    assert {r.node.kind for r in norm.reductions} == {"mean", "var"}
    assert {r.node.kind for r in logsumexp.reductions} == {"amax", "sum"}
    assert found.steps[1].reads[:3] == ["in0", "in1", "in2"]
    assert sorted(found.steps[1].reads[3:]) == sorted(found.buffers)
    assert found.steps[1].writes == ["out0"]


def test_a_mean_over_a_norms_output_reads_the_input_twice_and_writes_no_norm(tmp_path):
    found = program(tmp_path, "x, w, b", "F.group_norm(x, 4, w, b).mean(dim=[1, 2, 3])",
                    "torch.randn(3, 8, 6, 5), torch.randn(8), torch.randn(8)")
    assert len(found.steps) == 2
    assert sum(v.numel for v in found.buffers.values()) == 2 * 3 * 4
    assert [r.node.kind for r in found.steps[1].kernel.reductions] == ["mean"]


def test_a_cross_entropy_still_cuts_at_the_rows_losses(tmp_path):
    found = program(tmp_path, "x, t", "F.cross_entropy(x, t)",
                    "torch.randn(23, 10), torch.randint(0, 10, (23,))")
    assert len(found.steps) == 2
    (buffer,) = found.buffers.values()
    assert buffer.numel == 23  # a loss a row, not the rows' exponentials
