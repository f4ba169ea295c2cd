import os

import pytest
import torch

if not torch.cuda.is_available():
    # Triton kernels run on the CPU under its interpreter; it must be on before triton loads.
    os.environ.setdefault("TRITON_INTERPRET", "1")
INTERPRET_AT_START = os.environ.get("TRITON_INTERPRET")


def pytest_collection_finish(session):
    """On a GPU host a module that turned the interpreter on as it was imported would run every
    GPU test after it under the interpreter, where they fail for reasons of its own."""
    if os.environ.get("TRITON_INTERPRET") != INTERPRET_AT_START:
        raise pytest.UsageError("a module imported while collecting the tests changed "
                                "TRITON_INTERPRET; set it only in a script's __main__ or in a "
                                "child process's environment")


def pytest_collection_modifyitems(config, items):
    skip = pytest.mark.skip(reason="needs an NVIDIA GPU")
    if not torch.cuda.is_available():
        for item in items:
            if "gpu" in item.keywords:
                item.add_marker(skip)
