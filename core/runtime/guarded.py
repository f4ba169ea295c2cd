"""A site's kernel behind its guard: the kernel for the calls it was proven on, the site's own
PyTorch ops for every other call and for every call after the kernel failed at run time."""

from __future__ import annotations

import functools
import logging
import sys
import tempfile
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import torch
import torch.nn as nn

from .errors import error_line
from .problem_loader import import_file, write_candidate

log = logging.getLogger("kiln.install")


@dataclass(frozen=True)
class ProvenInput:
    shape: tuple[int, ...]
    stride: tuple[int, ...]
    dtype: str

    @staticmethod
    def of(tensor: torch.Tensor) -> ProvenInput:
        return ProvenInput(tuple(tensor.shape), tuple(tensor.stride()), str(tensor.dtype))


@dataclass(frozen=True)
class SiteKernel:
    """A winning kernel: its `ModelNew` source, the site problem it was proven on."""

    key: str
    source: str
    problem_source: str

    def proven(self) -> list[ProvenInput]:
        """The inputs the kernel was proven on: the problem's shapes, strides and dtypes."""
        with torch.device("meta"):
            inputs = _imported(self.problem_source).get_inputs()
        return [ProvenInput.of(t) for t in inputs]


class GuardedKernel(nn.Module):
    """The kernel for calls it was proven on; the site's own ops for any other call.

    Every installed call passes through here, and a model timed call by call pays for its
    Python before its first kernel starts: the check compares sizes, strides and dtypes as torch
    hands them over, with the counter keys made once."""

    def __init__(self, key: str, kernel: nn.Module, reference: nn.Module,
                 proven: list[ProvenInput], calls: Counter[str]) -> None:
        super().__init__()
        self.key, self.kernel, self.reference = key, kernel, reference
        self._expected = [(torch.Size(p.shape), p.stride, getattr(torch, p.dtype.split(".")[-1]))
                          for p in proven]
        self.calls = calls
        self.kernel_key, self.unproven_key = f"{key}: kernel", f"{key}: fallback (unproven call)"
        self.failure: str | None = None  # why the kernel was switched off, if it was

    def proven_for(self, args: tuple) -> bool:
        if len(args) != len(self._expected):
            return False
        device = None
        for arg, (shape, stride, dtype) in zip(args, self._expected, strict=True):
            if not (isinstance(arg, torch.Tensor) and arg.shape == shape
                    and arg.stride() == stride and arg.dtype == dtype):
                return False
            if device is None:
                device = arg.device
            elif arg.device != device:
                return False
        return True

    def forward(self, *args: torch.Tensor) -> object:
        if self.failure is not None:
            self.calls[f"{self.key}: fallback (kernel failed: {self.failure})"] += 1
            return self.reference(*args)
        if not self.proven_for(args):
            self.calls[self.unproven_key] += 1
            return self.reference(*args)
        try:
            result = self.kernel(*args)
        except Exception as err:  # the kernel is switched off, the call answered by PyTorch
            self.failure = error_line(err)
            log.warning("site %s: the kernel failed (%s); its PyTorch ops run from now on",
                        self.key, self.failure)
            self.calls[f"{self.key}: fallback (kernel failed: {self.failure})"] += 1
            return self.reference(*args)
        self.calls[self.kernel_key] += 1
        return result


@functools.cache
def _kernel_dir() -> Path:
    """Where installed kernels' sources are written (Triton reads a kernel back from its file):
    made once, on the first install, not on import."""
    return Path(tempfile.mkdtemp(prefix="kiln-installed-"))


def _imported(source: str) -> ModuleType:
    """`source` as a module, imported once per process (its name is its digest). Imported, not
    run from a string, and never imported twice: inductor pickles the classes of the modules it
    traces through into its cache key, and pickle finds a class by its module's name."""
    path, name = write_candidate(source, _kernel_dir())
    return sys.modules[name] if name in sys.modules else import_file(path, name)


def load_guarded(kernel: SiteKernel, calls: Counter[str]) -> GuardedKernel:
    model_new = _imported(kernel.source).ModelNew()
    reference = _imported(kernel.problem_source).Model()
    return GuardedKernel(kernel.key, model_new, reference, kernel.proven(), calls)

