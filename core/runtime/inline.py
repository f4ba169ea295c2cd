"""Installed Triton kernels traced into inductor's graph and launched by its generated code.

Called through a custom op, an installed kernel pays for Python on every call before its first
launch: the dispatcher, the guard, the module call, Triton's launcher. A model timed call by
call shows it. Where the rest of the model goes to inductor on a GPU, a site whose kernel
launches Triton kernels is traced instead. `torch.library.wrap_triton` turns each launch into
torch's Triton-kernel operator, and inductor compiles that into a launch from its own wrapper,
as it does for its own kernels.

The guard then decides once per compiled graph, on the traced tensors. torch.compile's guards
(static sizes, strides, dtypes and device of every graph input) hold each later call of that
graph to what was checked. A kernel that cannot be traced (CUDA through pycuda, Python reading
tensor data) runs as the custom op instead, in this graph and every later one.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import logging
import sys
import types
from collections import Counter
from collections.abc import Callable
from typing import TYPE_CHECKING

import torch
import torch.fx as fx
import torch.nn as nn

from .errors import error_line
from .stitch import Finish, stitching_backend

if TYPE_CHECKING:
    from .guarded import GuardedKernel

log = logging.getLogger("kiln.install")


def _rebound(function: types.FunctionType, namespace: dict[str, object]) -> types.FunctionType:
    rebound = types.FunctionType(function.__code__, namespace, function.__name__,
                                 function.__defaults__, function.__closure__)
    rebound.__kwdefaults__ = function.__kwdefaults__
    return rebound


def _traced_classes(module: types.ModuleType) -> dict[type, type]:
    """For each module class the kernel's file defines, a subclass whose methods see every
    Triton kernel of the file through `wrap_triton` (its other functions rebound likewise).
    The kernels keep the file's own namespace: Triton checks that the globals a kernel reads
    have not changed. Made once per file, and kept in it under `Traced<name>`: inductor pickles
    the classes it traces through into its cache key, and finds a class by name there."""
    from triton.runtime.jit import KernelInterface

    home = vars(module)
    classes = {value: home[f"Traced{name}"] for name, value in list(home.items())
               if f"Traced{name}" in home}
    if classes:
        return classes
    namespace = dict(home)
    for name, value in home.items():
        if isinstance(value, KernelInterface):
            # A kind wrap_triton refuses (e.g. @triton.heuristics) stays as it is: its trace fails.
            with contextlib.suppress(RuntimeError):
                namespace[name] = torch.library.wrap_triton(value)
        elif isinstance(value, types.FunctionType) and value.__globals__ is home:
            namespace[name] = _rebound(value, namespace)
    for name, value in list(home.items()):
        if (isinstance(value, type) and issubclass(value, nn.Module)
                and value.__module__ == module.__name__):
            methods: dict[str, object] = {
                attr: _rebound(f, namespace) for attr, f in vars(value).items()
                if isinstance(f, types.FunctionType)}
            methods.update(__module__=module.__name__, __qualname__=f"Traced{name}")
            classes[value] = type(f"Traced{name}", (value,), methods)
            setattr(module, f"Traced{name}", classes[value])
    return classes


def _copy_tree(module: nn.Module, classes: dict[type, type]) -> nn.Module:
    """`module` and its submodules copied (parameters shared), each of a traced class."""
    copied = copy.copy(module)
    copied.__dict__["_modules"] = {name: _copy_tree(child, classes) if child is not None
                                   else None for name, child in module._modules.items()}
    copied.__class__ = classes.get(type(module), type(module))
    return copied


def traceable(kernel: nn.Module) -> nn.Module:
    """A copy of the `ModelNew` `kernel` whose Python launches its Triton kernels through
    `wrap_triton`, in its own methods and in those of the modules it holds."""
    return _copy_tree(kernel, _traced_classes(sys.modules[type(kernel).__module__]))


class Untraceable(Exception):
    """A site's kernel failed to trace; the graph is compiled again with the op there."""


class TracedSite(nn.Module):
    """One call site of an installed kernel in a graph about to be traced: the kernel's
    launches go into the graph."""

    def __init__(self, key: str, kernel: nn.Module) -> None:
        super().__init__()
        self.key, self.kernel = key, kernel
        self.untraceable: str | None = None

    def forward(self, *args: torch.Tensor) -> object:
        try:
            return self.kernel(*args)
        except Exception as err:
            # Raised, not answered by the site's ops: a compiled graph that holds them would
            # be cached, and found again, as if it held the kernel.
            self.untraceable = error_line(err)
            raise Untraceable(self.untraceable) from err


def _counting(compiled: Callable, per_run: Counter[str], calls: Counter[str]) -> Callable:
    """`compiled`, adding each site's outcome to `calls` once per run."""
    if not per_run:
        return compiled

    def run(*args: object) -> object:
        result = compiled(*args)
        calls.update(per_run)
        return result

    run._boxed_call = getattr(compiled, "_boxed_call", False)  # how dynamo passes arguments
    return run


def _site_for(guarded: dict[str, GuardedKernel], kernels: dict[str, nn.Module],
              ops: dict[str, Callable], sites: list[TracedSite], per_run: Counter[str],
              untraceable: dict[str, str], trace: bool,
              key: str | None, inputs: list[object]) -> nn.Module | Callable | None:
    """What runs at one region: its traced kernel, its op, or (not proven) its own ops."""
    if key not in guarded:
        return None
    if key in untraceable or not trace:
        return ops[key]
    if not guarded[key].proven_for(tuple(inputs)):
        per_run[guarded[key].unproven_key] += 1
        return None
    per_run[guarded[key].kernel_key] += 1
    sites.append(TracedSite(key, kernels[key]))
    return sites[-1]


def keeping_layouts(finish: Finish, sites: list[TracedSite]) -> Finish:
    """`finish` with inductor's layout optimization off where a traced kernel's site holds a
    convolution. The optimization gives convolutions strides of its own, apart from the graph's:
    channels-last in 2-D, and in 3-D the input's conversion to channels-last undone. A kernel
    judged on torch's strides then reads a copy into them, one more pass over the convolution's
    output (bench/NOTES.md, 2026-12-07, 23:31-). A graph without such a site is compiled as
    torch.compile would."""

    def finish_keeping_layouts(gm: fx.GraphModule, example_inputs: list) -> Callable[..., object]:
        if not any(site.key.split("-")[0] == "conv" for site in sites):
            return finish(gm, example_inputs)
        from torch._inductor import config

        with config.patch(layout_optimization=False):
            return finish(gm, example_inputs)

    return finish_keeping_layouts


def tracing_backend(guarded: dict[str, GuardedKernel], ops: dict[str, Callable],
                    replaced: list[str], finish: Finish, calls: Counter[str],
                    untraceable: dict[str, str], on_gpu_only: bool = True
                    ) -> Callable[[fx.GraphModule, list], Callable[..., object]]:
    """A backend tracing each site's kernel into the graph `finish` compiles, or calling its
    op where the kernel cannot be traced (recorded in `untraceable`, key to why) or, with
    `on_gpu_only`, where the graph's inputs are not on a GPU.

    The guard decides on the region's inputs as dynamo traced them, before `finish` runs:
    inductor's caches may skip tracing a graph they have compiled before. A call the kernel
    was not proven for keeps the site's ops, compiled with the rest."""
    kernels = {key: traceable(g.kernel) for key, g in guarded.items()}

    def backend(gm: fx.GraphModule, example_inputs: list) -> Callable[..., object]:
        on_gpu = any(isinstance(t, torch.Tensor) and t.is_cuda for t in example_inputs)
        while True:
            sites: list[TracedSite] = []
            per_run: Counter[str] = Counter()
            used: list[str] = []
            lookup = functools.partial(_site_for, guarded, kernels, ops, sites, per_run,
                                       untraceable, on_gpu or not on_gpu_only)
            try:
                compiled = stitching_backend(lookup, used, keeping_layouts(finish, sites))(
                    gm, example_inputs)
                break
            except Exception as err:
                if not sites:
                    raise
                # A kernel that failed its trace says so; otherwise the traced graph itself
                # did not compile (a launch inductor cannot lower): every traced kernel goes
                # through its op.
                failed = ({s.key: s.untraceable for s in sites if s.untraceable}
                          or {s.key: f"the traced graph did not compile: {error_line(err)}"
                              for s in sites})
            for key, why in failed.items():
                log.info("site %s: its kernel cannot be traced (%s); it runs as a custom op",
                         key, why)
            untraceable.update(failed)
        replaced.extend(used)
        return _counting(compiled, per_run, calls)

    return backend
