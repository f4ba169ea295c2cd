"""Chat completions against any OpenAI-compatible endpoint, with bounded retries and costs.

Rate limits (429), server errors (5xx) and timeouts are retried with exponential backoff;
anything else, or retries running out, is an `EndpointError`. Every attempt that reached the
endpoint is kept as an `LlmCall` (prompt, reply or error, tokens, latency, cost), so the store
holds what the model was asked and what it answered.
"""

from __future__ import annotations

import time

import openai

from generators.llm.config import LlmCall, LlmConfig


class EndpointError(Exception):
    """The endpoint cannot serve this generator: unreachable, refusing, or out of retries."""

    def __init__(self, message: str, calls: list[LlmCall]) -> None:
        super().__init__(message)
        self.calls = calls


class RequestRejected(EndpointError):
    """The endpoint refused this one request (too long, malformed); others may still pass."""


# Statuses that reject the request rather than the endpoint: a prompt past a local model's
# context is answered 400 by vLLM and Ollama.
REJECTED = frozenset({400, 413, 422})


def render(messages: list[dict[str, str]]) -> str:
    return "\n\n".join(f"### {m['role']}\n{m['content']}" for m in messages)


def _retryable(error: openai.OpenAIError) -> bool:
    if isinstance(error, openai.APITimeoutError | openai.RateLimitError):
        return True
    return isinstance(error, openai.APIStatusError) and error.status_code >= 500


def _describe(error: openai.OpenAIError) -> str:
    if isinstance(error, openai.APITimeoutError):
        return "timed out"
    if isinstance(error, openai.APIStatusError):
        return f"answered HTTP {error.status_code}: {error.message}"
    return f"{type(error).__name__}: {error}"


class ChatClient:
    """A thread-safe chat-completions caller; one `complete` is one logical request."""

    def __init__(self, config: LlmConfig) -> None:
        self.config = config
        self.base_url = config.resolved_base_url()
        self.client = openai.OpenAI(base_url=self.base_url, api_key=config.resolved_api_key(),
                                    timeout=config.timeout_s, max_retries=0)

    @property
    def where(self) -> str:
        return self.base_url or "https://api.openai.com/v1"

    def complete(self, messages: list[dict[str, str]]) -> tuple[LlmCall, list[LlmCall]]:
        """The reply's call and the failed attempts before it; `EndpointError` if none came."""
        config = self.config
        prompt = render(messages)
        failed: list[LlmCall] = []
        attempt = 0
        while True:
            started = time.perf_counter()
            try:
                response = self.client.chat.completions.create(
                    model=config.model, messages=messages, temperature=config.temperature,
                    max_tokens=config.max_tokens)
            except (openai.APIConnectionError, openai.APIStatusError) as error:
                if not isinstance(error, openai.APITimeoutError | openai.APIStatusError):
                    raise EndpointError(f"cannot reach {self.where}: {error}", failed) from error
                failed.append(self._failure(prompt, started, error))
                if _retryable(error) and attempt < config.retries:
                    time.sleep(config.backoff_s * 2**attempt)
                    attempt += 1
                    continue
                tried = f" on {attempt + 1} attempts" if _retryable(error) else ""
                message = f"{self.where} {_describe(error)}{tried} (model {config.model})"
                if isinstance(error, openai.APIStatusError) and error.status_code in REJECTED:
                    raise RequestRejected(message, failed) from error
                raise EndpointError(message, failed) from error
            latency_ms = (time.perf_counter() - started) * 1e3
            usage = response.usage
            prompt_tokens = usage.prompt_tokens if usage else None
            completion_tokens = usage.completion_tokens if usage else None
            reply = response.choices[0].message.content if response.choices else None
            return LlmCall(config.model, prompt, reply or "", prompt_tokens, completion_tokens,
                           latency_ms, config.cost_usd(prompt_tokens, completion_tokens)), failed

    def _failure(self, prompt: str, started: float, error: openai.OpenAIError) -> LlmCall:
        return LlmCall(self.config.model, prompt, None, None, None,
                       (time.perf_counter() - started) * 1e3, None, _describe(error))
