"""The rules generator reads the parent's diagnosis: its first child moves the knob asked for."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

import pytest

from core.evaluate.diagnosis import (
    COMPUTE_BOUND,
    EXCESS_TRAFFIC,
    LATENCY_BOUND,
    NARROW_LOADS,
    NEAR_FLOOR_CODE,
    REGISTER_LIMITED,
    SHARED_LIMITED,
    SPILLING,
    UNCOALESCED,
)
from generators.base import Feedback, Parent, Proposal
from generators.compiler.schedule import Schedule
from generators.cuda.cluster_shares import ClusterNormConfig
from generators.cuda.pointwise import CudaPointwiseConfig, write_cuda_pointwise
from generators.llm.prompt import describe_feedback
from generators.mutations import diagnosed_neighbours, neighbours
from generators.rules import RulesGenerator
from generators.site_graph import load_site_graph
from generators.triton.matmul import MatmulConfig
from generators.triton.program import write_compiled


@pytest.fixture
def pointwise(tmp_path: Path) -> Path:
    path = tmp_path / "problem.py"
    path.write_text("import torch\nimport torch.nn as nn\n\n\nclass Model(nn.Module):\n"
                    "    def forward(self, x):\n        return torch.relu(x * 2.0)\n\n\n"
                    "def get_inputs():\n    return [torch.randn(256, 512)]\n\n\n"
                    "def get_init_inputs():\n    return []\n")
    return path


def parent_of(write, settings: object, source: str, tier: str, diagnosis: str) -> Parent:
    proposal = Proposal(source, tier, "rules", "the parent",
                        {"writer": write.__name__, **asdict(settings)})
    return Parent(proposal, Feedback(correct=True, latency_ms=0.05, baseline_ms=0.04,
                                     floor_ms=0.01, diagnosis=diagnosis))


def first_child(problem: Path, write, settings: object, tier: str, diagnosis: str) -> Proposal:
    """The first child the rules propose under a parent `write` wrote with `settings`, whose
    source the generator knows it proposed (a child writing the same is no child)."""
    generator = RulesGenerator()
    source = write(load_site_graph(problem), settings)
    generator.remember(problem, source)
    parent = parent_of(write, settings, source, tier, diagnosis)
    children = generator.propose(problem, parent, n=3, tiers=(tier,)).children
    assert children, "no children"
    return children[0]


@pytest.mark.parametrize("code,message,parent,child", [
    (SPILLING, "_pointwise: a 64-byte stack frame per thread at 255 registers",
     (1024, 4), (512, 4)),
    (REGISTER_LIMITED, "_pointwise: 168 registers/thread leave room for 8 of 64 warps",
     (1024, 4), (512, 4)),
    # The largest block already: more warps are the next way to put more in flight.
    (LATENCY_BOUND, "at 20% of the byte floor (0.0500 ms, floor 0.0100 ms)",
     (8192, 4), (8192, 8)),
])
def test_the_first_triton_child_answers_the_diagnosis(pointwise, code, message, parent, child):
    settings = Schedule(1, parent[0], parent[1])
    undiagnosed = neighbours(settings)[0].settings
    assert (undiagnosed.block_columns, undiagnosed.num_warps) != child
    first = first_child(pointwise, write_compiled, settings, "triton", f"{code}: {message}")
    assert (first.settings["block_columns"], first.settings["num_warps"]) == child, \
        first.rationale
    assert first.rationale.endswith(f"(the parent: {code})")
    assert f"BLOCK_COLUMNS={child[0]}, num_warps={child[1]}" in first.source


def test_narrow_loads_widen_the_cuda_vector(pointwise):
    child = first_child(pointwise, write_cuda_pointwise, CudaPointwiseConfig(vector_bytes=8),
                        "cuda", f"{NARROW_LOADS}: none of 6 global load instructions moves "
                                "16 bytes")
    assert child.settings["vector_bytes"] == 16, child.rationale
    assert child.settings["threads"] == 256 and "VEC = 4" in child.source


def test_without_a_diagnosis_the_order_is_unchanged(pointwise):
    settings = Schedule(1, 1024, 4)
    child = first_child(pointwise, write_compiled, settings, "triton", "")
    # More rows a program is the first step, but an elementwise kernel walks one flat row: it
    # writes the parent again, so the wider column block is the first child.
    assert neighbours(settings)[0].settings.block_rows == 2
    assert child.settings["block_columns"] == 2048
    assert "(the parent" not in child.rationale


def test_the_diagnosed_order_keeps_every_step():
    settings = Schedule(block_rows=2, num_warps=4, resident_per_sm=2)
    plain = neighbours(settings)
    for code in (SPILLING, LATENCY_BOUND, NEAR_FLOOR_CODE, "unknown"):
        ordered = diagnosed_neighbours(settings, f"{code}: numbers")
        assert sorted(str(s.settings) for s in ordered) == sorted(str(s.settings) for s in plain)
    assert diagnosed_neighbours(settings, f"{NEAR_FLOOR_CODE}: x") == plain


@pytest.mark.parametrize("code,knob,value", [
    (SPILLING, "block_columns", 512),  # fewer values a thread first: narrower column blocks
    (LATENCY_BOUND, "block_rows", 4),
])
def test_compiled_reductions_move_rows_per_program(code, knob, value):
    (first, *_) = diagnosed_neighbours(Schedule(block_rows=2), f"{code}: numbers")
    assert getattr(first.settings, knob) == value, first.rationale


def test_shared_memory_limited_matmuls_drop_a_stage_first():
    (first, second, *_) = diagnosed_neighbours(MatmulConfig(num_stages=4, block_k=64),
                                               f"{SHARED_LIMITED}: numbers")
    assert first.settings == MatmulConfig(num_stages=3, block_k=64)
    assert second.settings == MatmulConfig(num_stages=4, block_k=32)


@pytest.mark.parametrize("code,settings,knob,value", [
    (UNCOALESCED, CudaPointwiseConfig(vector_bytes=8), "vector_bytes", 16),
    (COMPUTE_BOUND, MatmulConfig(block_m=64, block_n=64), "block_m", 128),
    (COMPUTE_BOUND, Schedule(1, 1024, 4), "num_warps", 8),
    (EXCESS_TRAFFIC, MatmulConfig(block_m=64, block_n=64), "block_m", 128),
    (SHARED_LIMITED, ClusterNormConfig(vector=4), "held", "registers"),
    (LATENCY_BOUND, ClusterNormConfig(vector=4), "threads", 512),
    (SPILLING, ClusterNormConfig(vector=4, held="registers"), "held", "shared"),
])
def test_counter_diagnoses_pick_their_first_step(code, settings, knob, value):
    (first, *_) = diagnosed_neighbours(settings, f"{code}: DRAM 85%, SM 20% of peak")
    assert getattr(first.settings, knob) == value, first.rationale
    assert first.rationale.endswith(f"(the parent: {code})")


def test_the_refinement_prompt_carries_the_diagnosis():
    line = f"{SPILLING}: _pointwise: a 64-byte stack frame per thread at 255 registers"
    text = describe_feedback(Feedback(correct=True, latency_ms=0.05, floor_ms=0.01,
                                      diagnosis=line))
    assert text.splitlines()[-1] == ("Diagnosis (from the compiler's register, spill, "
                                     "shared-memory and load figures, the timing and, where "
                                     "read, Nsight Compute's hardware counters): " + line)
    assert "Diagnosis" not in describe_feedback(Feedback(correct=True, latency_ms=0.05))
