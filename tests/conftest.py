import os

import pytest
import torch

if not torch.cuda.is_available():
    # Triton kernels run on the CPU under its interpreter; it must be on before triton loads.
    os.environ.setdefault("TRITON_INTERPRET", "1")


def pytest_collection_modifyitems(config, items):
    skip = pytest.mark.skip(reason="needs an NVIDIA GPU")
    if not torch.cuda.is_available():
        for item in items:
            if "gpu" in item.keywords:
                item.add_marker(skip)
