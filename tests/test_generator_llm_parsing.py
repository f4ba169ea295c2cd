"""The reply's first fenced code block is the candidate; unusable replies go straight back."""

from __future__ import annotations

from pathlib import Path

from generators.llm.config import LlmConfig
from generators.llm.generator import LLMGenerator
from generators.llm.prompt import first_code_block, rationale_of, screen_reply
from tests.llm_server import LlmServer, Reply, contains, last_user_text

DATA = Path(__file__).parent / "data" / "evaluate"
PROBLEM = DATA / "pointwise_problem.py"
GOOD = (DATA / "good_pointwise.py").read_text()
TORCH_ANSWER = (DATA / "bad_torch_only.py").read_text()


def fenced(source: str, lang: str = "python") -> str:
    return f"Here is the kernel.\n\n```{lang}\n{source}```\n\nIt fuses the multiply and add."


def generator(url: str, **settings) -> LLMGenerator:
    return LLMGenerator(LlmConfig(base_url=url, api_key="test", timeout_s=5, backoff_s=0.01,
                                  concurrency=1, **settings))


def test_the_first_complete_block_is_the_candidate_whatever_its_language_tag():
    reply = "Plan:\n```text\nstep one\n```\nthen\n```python\nprint(2)\n```"
    assert first_code_block(reply) == "step one\n"
    assert first_code_block("```py\nx = 1\n```") == "x = 1\n"
    assert first_code_block("```\nx = 1\n```") == "x = 1\n"
    assert first_code_block("   ```python\nx = 1\n   ```\n") == "x = 1\n"


def test_no_block_an_empty_block_or_a_reply_cut_off_mid_block_give_no_candidate():
    assert first_code_block("class ModelNew: pass") is None
    assert first_code_block("```python\n\n```") is None
    assert first_code_block("```python\nimport torch\nclass ModelNew(") is None


def test_the_rationale_is_the_first_sentence_outside_the_code():
    assert rationale_of(fenced("x = 1\n"), "fallback") == "Here is the kernel."
    assert rationale_of("```python\nx = 1\n```", "fallback") == "fallback"


def test_screening_names_a_wrong_class_a_parse_error_and_broken_static_rules():
    problem = PROBLEM.read_text()
    wrong = screen_reply(fenced(GOOD.replace("class ModelNew", "class FusedModel")), problem)
    assert wrong.problems == ["the module defines no class named ModelNew (it defines "
                              "FusedModel)"]
    broken = screen_reply(fenced(GOOD.replace("n = x.numel()", "n = x.numel(")), problem)
    assert not broken.ok and "does not parse" in broken.problems[0]
    torch_only = screen_reply(fenced(TORCH_ANSWER), problem)
    assert not torch_only.ok and torch_only.problems
    assert screen_reply(fenced(GOOD), problem).ok


def test_a_reply_without_code_is_sent_back_and_its_fix_proposed():
    script = [Reply("I would fuse the multiply and the add into one kernel."),
              Reply(fenced(GOOD), expect=contains("no fenced code block", where=last_user_text))]
    with LlmServer(script) as server:
        result = generator(server.url).propose(PROBLEM, None, 1)
    assert server.failures == []
    assert len(server.requests) == 2
    (child,) = result.children
    assert child.source == GOOD and child.generator == "llm"
    assert child.settings["repairs"] == 1


def test_a_wrong_class_name_is_sent_back_with_the_name_it_used():
    script = [Reply(fenced(GOOD.replace("ModelNew", "Model2"))),
              Reply(fenced(GOOD), expect=contains("no class named ModelNew (it defines Model2)",
                                                  where=last_user_text))]
    with LlmServer(script) as server:
        result = generator(server.url).propose(PROBLEM, None, 1)
    assert server.failures == []
    assert [c.source for c in result.children] == [GOOD]


def test_torch_compute_as_the_answer_is_sent_back_with_the_static_violations():
    problem = PROBLEM.read_text()
    violations = screen_reply(fenced(TORCH_ANSWER), problem).problems
    script = [Reply(fenced(TORCH_ANSWER)),
              Reply(fenced(GOOD), expect=contains(violations[0], where=last_user_text))]
    with LlmServer(script) as server:
        result = generator(server.url).propose(PROBLEM, None, 1)
    assert server.failures == []
    assert [c.source for c in result.children] == [GOOD]


def test_past_the_repair_budget_unusable_code_goes_to_the_evaluator_and_no_code_is_declined():
    wrong = GOOD.replace("ModelNew", "Model2")
    with LlmServer([Reply(fenced(wrong)), Reply(fenced(wrong))]) as server:
        result = generator(server.url, max_repairs=1).propose(PROBLEM, None, 1)
    (child,) = result.children  # the evaluator rejects it and stores why
    assert child.source == wrong and child.settings["repairs"] == 1
    with LlmServer([Reply("no code"), Reply("still no code")]) as server:
        result = generator(server.url, max_repairs=1).propose(PROBLEM, None, 1)
    assert result.children == [] and "no fenced code block" in result.declined
    assert len(server.requests) == 2


def test_a_kernel_the_model_wrote_before_is_not_proposed_again():
    with LlmServer([Reply(fenced(GOOD)), Reply(fenced(GOOD))]) as server:
        llm = generator(server.url)
        assert len(llm.propose(PROBLEM, None, 1).children) == 1
        again = llm.propose(PROBLEM, None, 1)
    assert again.children == [] and "repeated" in again.declined
