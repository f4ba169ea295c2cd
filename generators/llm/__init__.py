"""The LLM generator: drafts, repairs, refinements and CUDA translations from a chat model."""
