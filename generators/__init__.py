"""Who writes kernels: the offline rules generator and the LLM generator."""
