"""Kernels found by Kiln, with `install(model)` to put them in an unmodified model."""

import os
import sys

import torch

# Triton's values of this switch (triton.knobs' env_bool).
_ON = ("1", "true", "yes", "on", "y")


def _interpret_without_a_gpu() -> None:
    """Without a CUDA device Triton finds "0 active drivers" unless its interpreter is on, and
    the switch is read as kernels are defined: so turn it on before Triton is first imported."""
    if torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET", "").lower() in _ON:
        return
    if "triton" in sys.modules:
        raise RuntimeError(
            "kiln_kernels: no CUDA device is visible, so its Triton kernels can run only under"
            " Triton's interpreter, and triton was imported before kiln_kernels could turn it"
            " on; set TRITON_INTERPRET=1 in the environment (or import kiln_kernels first)"
        )
    os.environ["TRITON_INTERPRET"] = "1"


_interpret_without_a_gpu()

from .install import SITES, install, kernels, stats  # noqa: E402  (after the switch above)

__all__ = ["SITES", "install", "kernels", "stats"]
