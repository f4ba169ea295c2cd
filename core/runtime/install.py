"""Installing winning kernels into the unmodified model.

    installed = install(model, kernels)            # kernels: SiteKernel per site key
    installed(*inputs)                             # sites call their kernels
    installed.stats()                              # kernel calls and fallbacks, per site

The model is compiled with a backend that cuts each graph into sites the way Kiln found them
and calls each winning site's kernel as a `torch.library` custom op. A guard in front of each
kernel checks every call against what the kernel was proven correct on (input shapes, strides,
dtypes, one device); any other call, and any call after the kernel failed at run time, runs
the site's original PyTorch ops: a wrong answer is never the price of a fallback. With
`rest="inductor"` every op and site without a winning kernel is handed to inductor, so the
model is as fast as `torch.compile` wherever Kiln found nothing better; the custom ops are
opaque to it. On a GPU, inductor launches Triton kernels itself (`core.runtime.inline`). Inference
only: with autograd recording, the original model runs, with a warning that says so.
"""

from __future__ import annotations

import logging
import re
import warnings
from collections import Counter
from collections.abc import Callable

import torch
import torch.nn as nn

from .guarded import GuardedKernel, SiteKernel, load_guarded
from .inline import tracing_backend
from .stitch import stitching_backend
from .tracing import set_tracing_rules

log = logging.getLogger("kiln.install")
_LIBRARY = torch.library.Library("kiln", "FRAGMENT")
_OPS: list[Callable] = []  # every custom op this process registered (names are never reused)


def _as_list(output: object) -> list[torch.Tensor]:
    return list(output) if isinstance(output, tuple | list) else [output]


def _owned(outputs: list[torch.Tensor], inputs: list[torch.Tensor]) -> list[torch.Tensor]:
    """Contiguous outputs that share no memory with the inputs, as the op's fake promises."""
    taken = {t.untyped_storage().data_ptr() for t in inputs}
    owned = []
    for out in outputs:
        out = out.contiguous()
        if out.untyped_storage().data_ptr() in taken:
            out = out.clone()
        owned.append(out)
    return owned


def site_op(guarded: GuardedKernel) -> Callable:
    """`guarded` as a custom op from the list of input tensors to the list of outputs.

    Defined through `torch.library.Library` rather than `torch.library.custom_op`: the latter
    wraps every call in Python for autograd, several times the cost of a call (bench/NOTES.md,
    second round, what installing costs), and the op never records autograd (`InstalledModel`
    runs the original model when it would)."""
    name = f"site_{re.sub(r'[^0-9A-Za-z]', '_', guarded.key)}_{len(_OPS)}"
    _LIBRARY.define(f"{name}(Tensor[] inputs) -> Tensor[]")

    def run(inputs: list[torch.Tensor]) -> list[torch.Tensor]:
        return _owned(_as_list(guarded.forward(*inputs)), inputs)

    def fake(inputs: list[torch.Tensor]) -> list[torch.Tensor]:
        return [out.new_empty(out.shape) for out in _as_list(guarded.reference(*inputs))]

    _LIBRARY.impl(name, run, "CompositeExplicitAutograd")
    torch.library.register_fake(f"kiln::{name}", fake, lib=_LIBRARY)
    op = getattr(torch.ops.kiln, name).default
    _OPS.append(op)
    return op


class InstalledModel(nn.Module):
    """The original model, compiled so that its sites call their kernels."""

    def __init__(self, original: nn.Module, compiled: Callable, kernels: dict[str, GuardedKernel],
                 calls: Counter[str], replaced: list[str],
                 untraceable: dict[str, str] | None = None) -> None:
        super().__init__()
        self.original = original
        self.compiled = compiled
        self.kernels = nn.ModuleDict({k.replace("-", "_"): v for k, v in kernels.items()})
        self.calls = calls
        self.replaced = replaced  # site keys replaced in the graphs compiled so far
        # Under inductor on a GPU: the sites whose kernel runs as a custom op, with why.
        self.untraceable = {} if untraceable is None else untraceable
        self._warned = False

    def forward(self, *args: object, **kwargs: object) -> object:
        recording = torch.is_grad_enabled() and (
            any(p.requires_grad for p in self.original.parameters())
            or any(isinstance(a, torch.Tensor) and a.requires_grad for a in args))
        if recording:
            if not self._warned:
                warnings.warn("Kiln's kernels are for inference and have no backward: with "
                              "autograd recording the original model runs. Call the model "
                              "under torch.no_grad() or torch.inference_mode() to use them.",
                              stacklevel=2)
                self._warned = True
            return self.original(*args, **kwargs)
        return self.compiled(*args, **kwargs)

    def stats(self) -> dict[str, int]:
        """How often each site ran its kernel, and fell back to PyTorch (and why)."""
        return dict(self.calls)

    def failures(self) -> dict[str, str]:
        """The sites whose kernel failed at run time and was switched off, with why."""
        return {k.key: k.failure for k in self.kernels.values() if k.failure is not None}


def install(model: nn.Module, kernels: list[SiteKernel], rest: str = "inductor",
            calls: Counter[str] | None = None, trace: bool | None = None) -> InstalledModel:
    """`model` with each kernel's site calling it; `rest` runs everything else: "inductor"
    (torch.compile's default compiler) or "eager" (the captured ops as they are). Kernel
    calls and fallbacks are counted in `calls` (a new counter if not given). With no kernels
    nothing is captured: the model runs as `torch.compile(model)`, or as it is (its captured
    graphs run eagerly can be slower than the model itself: ViT-B/16's were, in bf16 on an
    H200, bench/results/suite_h200_pass1.md).

    Under inductor, `trace` puts Triton kernels' launches into inductor's graph rather than behind a
    custom op (`core.runtime.inline`): by default on a GPU, where inductor launches them."""
    if rest not in ("inductor", "eager"):
        raise ValueError(f"rest must be 'inductor' or 'eager', not {rest!r}")
    calls = Counter() if calls is None else calls
    set_tracing_rules()
    if not kernels:
        return InstalledModel(model, torch.compile(model) if rest == "inductor" else model,
                              {}, calls, [])
    guarded = {k.key: load_guarded(k, calls) for k in kernels}
    ops = {key: site_op(g) for key, g in guarded.items()}
    replaced: list[str] = []
    untraceable: dict[str, str] = {}
    if rest == "eager":
        backend = stitching_backend(ops, replaced)
    else:
        from torch._inductor.compile_fx import compile_fx

        backend = (stitching_backend(ops, replaced, compile_fx) if trace is False else
                   tracing_backend(guarded, ops, replaced, compile_fx, calls, untraceable,
                                   on_gpu_only=trace is None))
    compiled = torch.compile(model, backend=backend, dynamic=False)
    return InstalledModel(model, compiled, guarded, calls, replaced, untraceable)
