"""What the LLM generator is configured with, and one request as the store keeps it.

Kept apart from the client so that a run with the offline generator alone never imports the
OpenAI SDK.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

# US$ per million prompt and completion tokens, from the providers' list prices (2026).
# Models not listed (local ones served by vLLM or Ollama) cost `LlmConfig.default_price`.
PRICES_PER_MTOK: dict[str, tuple[float, float]] = {
    "gpt-4o": (2.50, 10.00),
    "gpt-4o-mini": (0.15, 0.60),
    "gpt-4.1": (2.00, 8.00),
    "gpt-4.1-mini": (0.40, 1.60),
    "gpt-4.1-nano": (0.10, 0.40),
    "o3-mini": (1.10, 4.40),
    "o4-mini": (1.10, 4.40),
}
LOCAL_API_KEY = "not-needed"  # vLLM, Ollama and LM Studio accept any key


@dataclass(frozen=True)
class LlmConfig:
    model: str = "gpt-4o"
    base_url: str | None = None  # None: $OPENAI_BASE_URL, else OpenAI's
    api_key: str | None = None  # None: $OPENAI_API_KEY, else a placeholder for local servers
    temperature: float = 0.7
    max_tokens: int = 8192
    timeout_s: float = 300.0
    concurrency: int = 4  # requests in flight at once
    retries: int = 4  # after the first attempt, on 429, 5xx and timeouts
    backoff_s: float = 2.0  # first wait; doubles each retry
    max_repairs: int = 2  # repair requests along one chain of failed kernels
    prices: dict[str, tuple[float, float]] = field(default_factory=lambda: dict(PRICES_PER_MTOK))
    default_price: tuple[float, float] = (0.0, 0.0)

    def resolved_base_url(self) -> str | None:
        return self.base_url or os.environ.get("OPENAI_BASE_URL") or None

    def resolved_api_key(self) -> str:
        return self.api_key or os.environ.get("OPENAI_API_KEY") or LOCAL_API_KEY

    def cost_usd(self, prompt_tokens: int | None, completion_tokens: int | None) -> float:
        per_prompt, per_completion = self.prices.get(self.model, self.default_price)
        return ((prompt_tokens or 0) * per_prompt + (completion_tokens or 0) * per_completion) / 1e6


@dataclass(frozen=True)
class LlmCall:
    """One request to the model, as the store keeps it."""

    model: str
    prompt: str  # the messages, rendered as text
    reply: str | None
    prompt_tokens: int | None
    completion_tokens: int | None
    latency_ms: float
    cost_usd: float | None
    error: str | None = None
