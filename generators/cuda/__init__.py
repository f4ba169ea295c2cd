"""Tier-2 kernels: CUDA C++, compiled and launched through `core.runtime.cuda`."""
