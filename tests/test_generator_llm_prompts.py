"""What the model is told: rules, the site problem, shapes, GPU facts, the parent and its
feedback, and for the CUDA tier the Triton kernel to translate."""

from __future__ import annotations

from pathlib import Path

import pytest

from core.profile.roofline import GpuPeaks
from generators.base import Feedback, Parent, Proposal
from generators.llm.config import LlmConfig
from generators.llm.generator import LLMGenerator
from generators.llm.prompt import describe_feedback, describe_inputs, gpu_facts
from tests.llm_server import LlmServer, Reply, prompt_text

DATA = Path(__file__).parent / "data" / "evaluate"
PROBLEM = DATA / "pointwise_problem.py"
GOOD = (DATA / "good_pointwise.py").read_text()
GOOD_CUDA = (DATA / "good_cuda_pointwise.py").read_text()
BAD = GOOD.replace("tl.arange(0, BLOCK)", "tl.arange(0, BLOK)")
COMPILE_LOG = "line 9, in fused_kernel: NameError: name 'BLOK' is not defined"


def ask(parent: Parent | None, tiers=("triton",), reply: str = GOOD):
    """One proposal through the server; the request it received and the proposals."""
    with LlmServer([Reply(f"```python\n{reply}```")]) as server:
        llm = LLMGenerator(LlmConfig(base_url=server.url, api_key="test", concurrency=1))
        result = llm.propose(PROBLEM, parent, 1, tiers)
    (request,) = server.requests
    return request, result


def llm_parent(source: str, feedback: Feedback, tier: str = "triton") -> Parent:
    return Parent(Proposal(source, tier, "llm", "draft", {"llm": "draft", "repairs": 0}),
                  feedback)


def test_a_draft_carries_the_rules_the_problem_its_shapes_and_the_gpu():
    request, result = ask(None)
    system, user = request["messages"]
    assert system["role"] == "system"
    for rule in ("class ModelNew(nn.Module)", "@triton.jit", "torch ops", "try/except",
                 "Only the first\nfenced code block", "anchor matmul or convolution"):
        assert rule in system["content"], rule
    assert PROBLEM.read_text().strip() in user["content"]
    assert "- `x`: shape (1037,), torch.float32, contiguous" in user["content"]
    assert "132 SMs" in user["content"] and "4.3 TB/s" in user["content"]
    assert "Tier `triton`" in user["content"]
    (child,) = result.children
    assert (child.tier, child.settings["llm"], child.settings["repairs"]) == ("triton", "draft", 0)


def test_a_repair_carries_the_failed_kernel_numbered_and_the_compiler_output():
    failed = Feedback(correct=False, reason="raised NameError", compile_log=COMPILE_LOG)
    request, result = ask(llm_parent(BAD, failed))
    text = prompt_text(request)
    assert "failed. Fix it." in text
    assert "   9      offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOK)" in text
    assert "Verdict: rejected: raised NameError" in text and COMPILE_LOG in text
    assert PROBLEM.read_text().strip() in text
    (child,) = result.children
    assert (child.settings["llm"], child.settings["repairs"]) == ("repair", 1)


def test_a_refinement_carries_the_kernel_with_latency_baseline_and_floor():
    measured = Feedback(correct=True, latency_ms=0.02, baseline_ms=0.03, floor_ms=0.005)
    request, result = ask(llm_parent(GOOD, measured), reply=GOOD.replace("256", "1024"))
    text = prompt_text(request)
    assert "is correct. Make it faster." in text and GOOD.strip() in text
    assert "Latency 0.0200 ms" in text and "baseline" in text and "speedup 1.50x" in text
    assert "Roofline floor" in text and "0.0050 ms: the kernel runs at 25% of it" in text
    assert result.children[0].settings["llm"] == "refine"


def test_the_cuda_tier_translates_the_best_triton_kernel_for_pycuda():
    measured = Feedback(correct=True, latency_ms=0.02, baseline_ms=0.03, floor_ms=0.005)
    parent = Parent(Proposal(GOOD, "triton", "rules", "one pass"), measured)
    request, result = ask(parent, tiers=("triton", "cuda"), reply=GOOD_CUDA)
    text = prompt_text(request)
    assert "Translate it into CUDA C++" in text and GOOD.strip() in text
    assert "load_kernel(SOURCE" in text and "Tier `cuda`" in text
    (child,) = result.children
    assert (child.tier, child.settings["llm"]) == ("cuda", "translate_cuda")


def test_a_failed_kernel_of_another_generator_is_not_repaired():
    failed = Feedback(correct=False, reason="raised NameError")
    parent = Parent(Proposal(BAD, "triton", "rules", "one pass"), failed)
    llm = LLMGenerator(LlmConfig(base_url="http://127.0.0.1:9/v1", api_key="test"))
    result = llm.propose(PROBLEM, parent, 1)
    assert result.children == [] and "only its own kernels" in result.declined
    assert not llm.can_repair(parent.proposal, failed)


def test_the_repair_budget_is_counted_along_the_chain():
    llm = LLMGenerator(LlmConfig(base_url="http://127.0.0.1:9/v1", api_key="test",
                                 max_repairs=2))
    failed = Feedback(correct=False, reason="wrong values")
    for repairs, allowed in ((0, True), (1, True), (2, False)):
        proposal = Proposal(BAD, "triton", "llm", "fix", {"repairs": repairs})
        assert llm.can_repair(proposal, failed) is allowed
    accepted = Feedback(correct=True, latency_ms=1.0, baseline_ms=1.0)
    assert not llm.can_repair(Proposal(GOOD, "triton", "llm", "draft"), accepted)


def test_feedback_and_gpu_facts_read_plainly():
    assert describe_feedback(None) == "Not measured yet."
    wrong = describe_feedback(Feedback(correct=False, reason="seed 0: 3 of 1037 elements ..."))
    assert wrong == "Verdict: rejected: seed 0: 3 of 1037 elements ..."
    facts = gpu_facts(GpuPeaks())
    assert "bf16 798" in facts and "fp32 vector 67" in facts
    assert "tf32 403" in facts and "fp32 as three tf32 products 134" in facts


@pytest.mark.gpu
def test_on_a_gpu_the_facts_are_the_device_s_and_the_translation_is_accepted():
    import torch

    from core.evaluate import EvalConfig, evaluate

    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    facts = gpu_facts(GpuPeaks())
    assert props.name in facts and f"{props.multi_processor_count} SMs" in facts
    measured = Feedback(correct=True, latency_ms=0.02, baseline_ms=0.03, floor_ms=0.005)
    parent = Parent(Proposal(GOOD, "triton", "rules", "one pass"), measured)
    _, result = ask(parent, tiers=("triton", "cuda"), reply=GOOD_CUDA)
    verdict = evaluate(PROBLEM, result.children[0].source, EvalConfig(device="cuda"))
    assert verdict.correct, verdict.reason


HUGE = """
import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x, scale):
        return x * scale


def get_inputs():
    return [torch.rand(1 << 20, 1 << 20).t(), 0.5]


def get_init_inputs():
    return []
"""


def test_the_inputs_are_described_without_being_drawn(tmp_path):
    # Four TiB of fp32: drawn for real, it could not be described at all.
    path = tmp_path / "problem.py"
    path.write_text(HUGE)
    assert describe_inputs(path).splitlines() == [
        "- `x`: shape (1048576, 1048576), torch.float32, strides (1, 1048576)",
        "- `scale`: 0.5"]
