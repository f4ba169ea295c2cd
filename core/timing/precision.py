"""How fp32 matmuls multiply while Kiln runs PyTorch: as fp32, PyTorch's default, or on TF32
tensor cores when a run allows TF32 (`--allow-tf32`).

Every PyTorch run a speedup is measured against (the profile, the site baselines, the judge's
reference, the end-to-end check) runs under the run's setting, and candidates are held to it
(`core.evaluate.config.EvalConfig.tf32_for`): a kernel that multiplies in TF32 is never
compared with a baseline that multiplies in fp32. cuDNN's convolutions are left as PyTorch
leaves them (TF32 for fp32 inputs): that is what the user's model does.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

import torch

# Triton's `tl.dot` multiplies fp32 operands as TF32 unless told otherwise; this environment
# variable changes the default for kernels compiled after it is set.
TRITON_FP32_DEFAULT = "TRITON_F32_DEFAULT"


@contextmanager
def fp32_matmuls(allow_tf32: bool) -> Iterator[None]:
    """PyTorch's fp32 matmuls in TF32 or not, for the duration."""
    before = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = allow_tf32
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32 = before


def hold_candidate_to(tf32: bool) -> None:
    """Set, for the rest of a candidate's process, how its fp32 products multiply: its library
    matmuls as its baseline's do, and its Triton dots as exact fp32 unless TF32 is allowed."""
    torch.backends.cuda.matmul.allow_tf32 = tf32
    if tf32:
        os.environ.pop(TRITON_FP32_DEFAULT, None)
    else:
        os.environ[TRITON_FP32_DEFAULT] = "ieee"
