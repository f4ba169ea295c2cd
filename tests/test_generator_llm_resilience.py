"""Rate limits, server errors and timeouts are retried; a dead endpoint stops only the LLM."""

from __future__ import annotations

import time
from pathlib import Path

from generators.llm.config import LlmCall, LlmConfig
from generators.llm.generator import LLMGenerator
from tests.llm_server import LlmServer, Reply, closed_port_url, contains

DATA = Path(__file__).parent / "data" / "evaluate"
PROBLEM = DATA / "pointwise_problem.py"
GOOD = (DATA / "good_pointwise.py").read_text()
GOOD_REPLY = f"```python\n{GOOD}```\nOne fused pass."


class Calls:
    """The generator's `record` and `notify`: what the store and the progress line would get."""

    def __init__(self) -> None:
        self.calls: list[LlmCall] = []
        self.messages: list[str] = []

    def record(self, problem: Path, call: LlmCall) -> int:
        assert problem == PROBLEM.resolve()
        self.calls.append(call)
        return len(self.calls)


def generator(url: str, calls: Calls, **settings) -> LLMGenerator:
    config = dict(base_url=url, api_key="test", timeout_s=1.0, backoff_s=0.01, retries=3,
                  concurrency=1, model="gpt-4o-mini") | settings
    return LLMGenerator(LlmConfig(**config), record=calls.record, notify=calls.messages.append)


def test_a_429_is_retried_and_every_attempt_is_recorded_with_tokens_and_cost():
    calls = Calls()
    script = [Reply(status=429), Reply(GOOD_REPLY, prompt_tokens=2000, completion_tokens=500,
                                       expect=contains("x * y + x"))]
    with LlmServer(script) as server:
        result = generator(server.url, calls).propose(PROBLEM, None, 1)
    assert server.failures == []
    (child,) = result.children
    assert child.llm_call_id == 2, "the proposal points at the call that wrote it"
    failed, answered = calls.calls
    assert failed.error.startswith("answered HTTP 429") and failed.reply is None
    assert answered.error is None and answered.reply == GOOD_REPLY
    assert (answered.prompt_tokens, answered.completion_tokens) == (2000, 500)
    # gpt-4o-mini: $0.15 and $0.60 per million prompt and completion tokens.
    assert answered.cost_usd == (2000 * 0.15 + 500 * 0.60) / 1e6
    assert answered.latency_ms > 0 and "x * y + x" in answered.prompt


def test_a_local_model_costs_nothing_unless_priced():
    calls = Calls()
    with LlmServer([Reply(GOOD_REPLY)]) as server:
        generator(server.url, calls, model="qwen2.5-coder:32b").propose(PROBLEM, None, 1)
    assert calls.calls[0].cost_usd == 0.0
    config = LlmConfig(model="qwen2.5-coder:32b", default_price=(1.0, 2.0))
    assert config.cost_usd(1_000_000, 500_000) == 2.0


def test_a_timeout_is_retried():
    calls = Calls()
    with LlmServer([Reply(GOOD_REPLY, delay_s=2.0), Reply(GOOD_REPLY)]) as server:
        result = generator(server.url, calls, timeout_s=0.5).propose(PROBLEM, None, 1)
    assert len(result.children) == 1
    assert [c.error for c in calls.calls] == ["timed out", None]


def test_a_run_of_500s_ends_the_llm_part_once_and_later_calls_return_at_once():
    calls = Calls()
    with LlmServer([Reply(status=500)] * 4) as server:
        llm = generator(server.url, calls, retries=3)
        first = llm.propose(PROBLEM, None, 2)
        started = time.perf_counter()
        later = llm.propose(PROBLEM, None, 2)
        seconds = time.perf_counter() - started
    assert first.children == [] and later.children == []
    assert "HTTP 500" in first.declined and "on 4 attempts" in first.declined
    # The request count is the check (a later call that asked again shows there); the time only
    # says it waited on nothing, with room for a loaded machine.
    assert later.declined == first.declined and seconds < 1.0
    assert len(server.requests) == 4, "the second call, and the first call's second request, " \
        "must not ask again"
    assert len(calls.messages) == 1 and "The search goes on without it" in calls.messages[0]
    assert all(c.error.startswith("answered HTTP 500") for c in calls.calls)
    assert len(calls.calls) == 4


def test_an_unreachable_endpoint_is_declined_with_a_clear_message():
    calls = Calls()
    llm = generator(closed_port_url(), calls)
    result = llm.propose(PROBLEM, None, 2)
    assert result.children == []
    assert "cannot reach http://127.0.0.1:" in result.declined
    assert "--llm-base-url" in result.declined
    assert calls.messages == [llm.dead]
    assert calls.calls == [], "nothing reached the endpoint, nothing to store"


def test_a_rejected_request_fails_only_itself():
    calls = Calls()
    with LlmServer([Reply(status=400), Reply(GOOD_REPLY)]) as server:
        llm = generator(server.url, calls)
        refused = llm.propose(PROBLEM, None, 1)
        answered = llm.propose(PROBLEM, None, 1)
    assert refused.children == [] and "HTTP 400" in refused.declined
    assert not llm.dead and len(answered.children) == 1
    assert calls.messages == []


def test_the_n_requests_of_one_call_are_in_flight_together():
    calls = Calls()
    with LlmServer([Reply(GOOD_REPLY.replace("256", str(b)), delay_s=0.4)
                    for b in (64, 128, 512)]) as server:
        llm = generator(server.url, calls, concurrency=3)
        started = time.perf_counter()
        result = llm.propose(PROBLEM, None, 3)
        seconds = time.perf_counter() - started
    assert len(result.children) == 3
    assert server.most_in_flight == 3, (
        f"at most {server.most_in_flight} of 3 requests in flight at once ({seconds:.2f} s)")
