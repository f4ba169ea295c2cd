"""Installs this package's kernels into an unmodified PyTorch model.

    import kiln_kernels
    fast = kiln_kernels.install(model)      # the same model, its sites calling the kernels
    fast(*inputs)
    kiln_kernels.stats()                    # kernel calls and fallbacks, per site

`install` compiles the model with a torch.compile backend that cuts each graph into sites the
way Kiln did when it found them, and calls a site's kernel wherever the site occurs. A guard in
front of every kernel checks each call against what the kernel was proven correct for (input
shapes, strides, dtypes and device); any other call runs the site's original PyTorch ops, so
a call the kernel was not proven for never gets a wrong answer. Inference only: gradients do
not flow through the kernels.
"""

from __future__ import annotations

import importlib.util
import json
from collections import Counter
from pathlib import Path
from types import ModuleType

import torch
import torch.nn as nn

from ._kiln.stitch import stitching_backend

HERE = Path(__file__).resolve().parent
SITES = json.loads((HERE / "sites.json").read_text())
_CALLS: Counter[str] = Counter()


def _module(path: Path, name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class GuardedKernel(nn.Module):
    """The kernel for calls it was proven on; the site's own ops for any other call."""

    def __init__(self, key: str, kernel: nn.Module, reference: nn.Module,
                 proven: list[dict]) -> None:
        super().__init__()
        self.key, self.kernel, self.reference = key, kernel, reference
        self.proven = [(tuple(p["shape"]), tuple(p["stride"]), p["dtype"]) for p in proven]

    def _proven_for(self, args: tuple) -> bool:
        if len(args) != len(self.proven):
            return False
        for arg, (shape, stride, dtype) in zip(args, self.proven, strict=True):
            if not isinstance(arg, torch.Tensor):
                return False
            if (tuple(arg.shape), arg.stride(), str(arg.dtype)) != (shape, stride, dtype):
                return False
        devices = {arg.device for arg in args}
        return len(devices) == 1

    def forward(self, *args: torch.Tensor) -> object:
        if torch.is_grad_enabled() and any(a.requires_grad for a in args):
            _CALLS[f"{self.key}: fallback (autograd)"] += 1
            return self.reference(*args)
        if self._proven_for(args):
            _CALLS[f"{self.key}: kernel"] += 1
            return self.kernel(*args)
        _CALLS[f"{self.key}: fallback (unproven call)"] += 1
        return self.reference(*args)


def kernels() -> dict[str, nn.Module]:
    """Every site's guarded kernel, by site key."""
    modules = {}
    for site in SITES:
        key = site["key"]
        kernel = _module(HERE / "kernels" / f"{key}.py", f"kiln_kernel_{key.replace('-', '_')}")
        problem = _module(HERE / "problems" / f"{key}.py", f"kiln_site_{key.replace('-', '_')}")
        modules[key] = GuardedKernel(key, kernel.ModelNew(), problem.Model(), site["proven"])
    return modules


def install(model: nn.Module) -> nn.Module:
    """`model`, compiled so that its sites call this package's kernels."""
    torch._dynamo.reset()
    return torch.compile(model, backend=stitching_backend(kernels()), dynamic=False)


def stats() -> dict[str, int]:
    """How often each site ran its kernel, and fell back to PyTorch (and why)."""
    return dict(_CALLS)
