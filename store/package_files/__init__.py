"""Kernels found by Kiln, with `install(model)` to put them in an unmodified model."""

from .install import SITES, install, kernels, stats

__all__ = ["SITES", "install", "kernels", "stats"]
