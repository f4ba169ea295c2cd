"""Installed kernels traced into inductor's graph: the guard decided at trace time, counted
per run, and kernels that cannot be traced called through their custom op."""

from __future__ import annotations

import pickle
from collections import Counter

import torch

from core.runtime.guarded import SiteKernel, load_guarded
from core.runtime.inline import traceable, tracing_backend
from core.runtime.install import install, site_op
from tests import models
from tests.test_install import assert_close, site_kernels

OWN_OPS = "\n\nclass ModelNew(Model):\n    \"\"\"The site's own ops: traceable anywhere.\"\"\"\n"


def own_ops(kernels: list[SiteKernel]) -> list[SiteKernel]:
    return [SiteKernel(k.key, k.problem_source + OWN_OPS, k.problem_source) for k in kernels]


def kernel_calls(stats: dict[str, int]) -> dict[str, int]:
    return {call.split(": ")[0]: n for call, n in stats.items() if call.endswith(": kernel")}


def test_traced_kernels_are_counted_once_per_run_of_the_compiled_graph(tmp_path):
    model, inputs = models.make_mlp()
    kernels = own_ops(site_kernels(model, inputs, tmp_path))
    torch._dynamo.reset()
    installed = install(model, kernels, rest="inductor", trace=True)
    with torch.no_grad():
        for _ in range(3):
            assert_close(installed(*inputs), model(*inputs), "mlp with traced kernels")
    assert installed.untraceable == {}
    assert kernel_calls(installed.stats()) == {k.key: 3 for k in kernels}
    assert sorted(installed.replaced) == sorted(k.key for k in kernels)


def test_a_kernel_that_cannot_be_traced_runs_as_its_custom_op(tmp_path):
    """Triton kernels under the interpreter cannot be traced (they read the fake tensors'
    data): each site says why and still runs its kernel, through the op."""
    model, inputs = models.make_mlp()
    kernels = site_kernels(model, inputs, tmp_path)
    torch._dynamo.reset()
    installed = install(model, kernels, rest="inductor", trace=True)
    with torch.no_grad():
        for _ in range(2):
            assert_close(installed(*inputs), model(*inputs), "mlp with untraceable kernels")
    assert set(installed.untraceable) == {k.key for k in kernels}
    assert all(installed.untraceable.values()), installed.untraceable
    assert kernel_calls(installed.stats()) == {k.key: 2 for k in kernels}


def test_the_guard_decides_on_the_traced_tensors(tmp_path):
    """A kernel proven on other sizes is not traced in: the site's own ops are, and every run
    of the graph counts an unproven call."""
    model, inputs = models.make_mlp()
    kernel = own_ops(site_kernels(model, inputs, tmp_path))[0]
    other_batch = kernel.problem_source.replace("_tensor((4, 8, 32), (256, 32, 1)",
                                                "_tensor((5, 8, 32), (256, 32, 1)")
    assert other_batch != kernel.problem_source, "the fixture's batch size changed"
    proven_elsewhere = SiteKernel(kernel.key, other_batch + OWN_OPS, other_batch)
    torch._dynamo.reset()
    installed = install(model, [proven_elsewhere], rest="inductor", trace=True)
    with torch.no_grad():
        for _ in range(2):
            assert_close(installed(*inputs), model(*inputs), "mlp with an unproven site")
    assert installed.stats() == {f"{kernel.key}: fallback (unproven call)": 2}


def test_on_the_cpu_by_default_kernels_are_called_through_their_op(tmp_path):
    model, inputs = models.make_mlp()
    kernels = own_ops(site_kernels(model, inputs, tmp_path))
    torch._dynamo.reset()
    installed = install(model, kernels, rest="inductor")
    with torch.no_grad():
        installed(*inputs)
    assert installed.untraceable == {}
    assert kernel_calls(installed.stats()) == {k.key: 1 for k in kernels}


def test_a_traced_graph_that_does_not_compile_is_compiled_again_with_the_ops(tmp_path):
    model, inputs = models.make_mlp()
    kernels = own_ops(site_kernels(model, inputs, tmp_path))
    calls: Counter[str] = Counter()
    guarded = {k.key: load_guarded(k, calls) for k in kernels}
    ops = {key: site_op(g) for key, g in guarded.items()}

    def finish(gm: torch.fx.GraphModule, example_inputs: list) -> object:
        if any(node.op == "call_module" for node in gm.graph.nodes):
            raise NotImplementedError("cannot lower a user kernel")
        return gm

    replaced: list[str] = []
    untraceable: dict[str, str] = {}
    torch._dynamo.reset()
    backend = tracing_backend(guarded, ops, replaced, finish, calls, untraceable,
                              on_gpu_only=False)
    compiled = torch.compile(model, backend=backend, dynamic=False)
    with torch.no_grad():
        assert_close(compiled(*inputs), model(*inputs), "mlp compiled with its ops")
    why = ("the traced graph did not compile: NotImplementedError: cannot lower a user "
           "kernel")
    assert untraceable == {k.key: why for k in kernels}
    assert kernel_calls(calls) == {k.key: 1 for k in kernels}, "the ops did not run"
    assert sorted(replaced) == sorted(k.key for k in kernels)


def test_the_traceable_copy_computes_the_same_and_its_class_is_found_by_name(tmp_path):
    """Inductor pickles the classes it traces through into its cache key."""
    norm = torch.nn.LayerNorm(32).eval()
    kernel = next(k for k in site_kernels(norm, (torch.randn(4, 8, 32),), tmp_path)
                  if k.key.startswith("reduction"))  # the norm: x, its weight and its bias
    calls: Counter[str] = Counter()
    guarded = load_guarded(kernel, calls)
    copy = traceable(guarded.kernel)
    assert type(copy) is not type(guarded.kernel)
    assert pickle.loads(pickle.dumps(type(copy))) is type(copy)
    problem_inputs = [torch.randn(4, 8, 32), torch.ones(32), torch.zeros(32)]
    assert_close(copy(*problem_inputs), guarded.kernel(*problem_inputs), "the traceable copy")


HELD = """

class Epilogue(nn.Module):
    def forward(self, *args):
        return Model.forward(self, *args)


class ModelNew(nn.Module):
    \"\"\"Its work in a module it holds.\"\"\"

    def __init__(self):
        super().__init__()
        self.epilogue = Epilogue()

    def forward(self, *args):
        return self.epilogue(*args)
"""


def test_the_modules_a_kernel_holds_are_traceable_copies_too(tmp_path):
    """A kernel may run its work in a module it holds: that module's launches must be wrapped
    as well, and the installed kernel left as it was."""
    model, inputs = models.make_cnn()
    conv = next(k for k in site_kernels(model, inputs, tmp_path) if k.key.startswith("conv"))
    held = SiteKernel(conv.key, conv.problem_source + HELD, conv.problem_source)
    kernel = load_guarded(held, Counter()).kernel
    copy = traceable(kernel)
    assert type(copy.epilogue).__name__ == f"Traced{type(kernel.epilogue).__name__}"
    assert copy.epilogue is not kernel.epilogue
    assert not type(kernel.epilogue).__name__.startswith("Traced"), "the original was changed"
    assert traceable(kernel).epilogue.__class__ is copy.epilogue.__class__, "made twice"


def layout_optimization_at_finish(model: torch.nn.Module, inputs: tuple,
                                  kernels: list[SiteKernel]) -> list[bool]:
    """Inductor's layout optimization setting each time the traced graph was compiled."""
    from torch._inductor import config

    calls: Counter[str] = Counter()
    guarded = {k.key: load_guarded(k, calls) for k in kernels}
    seen: list[bool] = []

    def finish(gm: torch.fx.GraphModule, example_inputs: list) -> object:
        seen.append(config.layout_optimization)
        return gm

    torch._dynamo.reset()
    backend = tracing_backend(guarded, {key: site_op(g) for key, g in guarded.items()}, [],
                              finish, calls, {}, on_gpu_only=False)
    with torch.no_grad():
        assert_close(torch.compile(model, backend=backend, dynamic=False)(*inputs),
                     model(*inputs), "the traced graph")
    return seen


def test_a_graph_tracing_a_convolution_site_keeps_torchs_layouts(tmp_path):
    """Inductor's layout optimization would give the kernel's convolution strides of its own
    and copy its output back into those the kernel was judged on."""
    model, inputs = models.make_cnn()
    kernels = own_ops(site_kernels(model, inputs, tmp_path))
    assert any(k.key.startswith("conv-") for k in kernels), [k.key for k in kernels]
    assert layout_optimization_at_finish(model, inputs, kernels) == [False]


def test_a_graph_tracing_no_convolution_site_is_compiled_as_torch_compile_would(tmp_path):
    model, inputs = models.make_cnn()
    kernels = [k for k in own_ops(site_kernels(model, inputs, tmp_path))
               if not k.key.startswith("conv-")]
    assert kernels, "the fixture has no site but its convolutions"
    assert layout_optimization_at_finish(model, inputs, kernels) == [True]
