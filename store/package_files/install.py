"""Installs this package's kernels into an unmodified PyTorch model.

    import kiln_kernels
    fast = kiln_kernels.install(model)      # the same model, its sites calling the kernels
    with torch.inference_mode():
        fast(*inputs)
    kiln_kernels.stats()                    # kernel calls and fallbacks, per site

`install` compiles the model with a torch.compile backend that cuts each graph into sites the
way Kiln did when it found them, and calls a site's kernel, as a custom op, wherever the site
occurs; every other op goes to inductor (`rest="eager"` leaves them as they are). A guard in
front of every kernel checks each call against what the kernel was proven correct for (input
shapes, strides, dtypes and device); any other call, and every call after a kernel failed at
run time, runs the site's original PyTorch ops, so a call the kernel was not proven for never
gets a wrong answer. Inference only: with autograd recording, the original model runs.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import torch.nn as nn

from ._kiln.guarded import GuardedKernel, SiteKernel, load_guarded
from ._kiln.install import InstalledModel
from ._kiln.install import install as install_kernels

HERE = Path(__file__).resolve().parent
SITES = json.loads((HERE / "sites.json").read_text())
_CALLS: Counter[str] = Counter()


def site_kernels() -> list[SiteKernel]:
    return [SiteKernel(site["key"], (HERE / "kernels" / f"{site['key']}.py").read_text(),
                       (HERE / "problems" / f"{site['key']}.py").read_text())
            for site in SITES]


def kernels() -> dict[str, GuardedKernel]:
    """Every site's guarded kernel, by site key."""
    return {kernel.key: load_guarded(kernel, _CALLS) for kernel in site_kernels()}


def install(model: nn.Module, rest: str = "inductor") -> InstalledModel:
    """`model`, compiled so that its sites call this package's kernels."""
    return install_kernels(model, site_kernels(), rest=rest, calls=_CALLS)


def stats() -> dict[str, int]:
    """How often each site ran its kernel, and fell back to PyTorch (and why)."""
    return dict(_CALLS)
