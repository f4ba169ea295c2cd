"""Winning kernels installed in the unmodified model: correct end to end, guarded, fallible."""

from __future__ import annotations

import warnings
from collections import Counter
from pathlib import Path

import pytest
import torch

from core.evaluate.correctness import TOLERANCES, compare_outputs
from core.profile.roofline import GpuPeaks
from core.profile.sites import find_sites, write_site_folder
from core.runtime.capture import capture
from core.runtime.guarded import GuardedKernel, ProvenInput, SiteKernel
from core.runtime.install import install
from generators.rules import RulesGenerator
from tests import models
from tests.test_site_problems import FACTORIES, import_problem
from tests.test_stitch import model_and_inputs

CPU = torch.device("cpu")
FP32 = {torch.float32: ("fp32", TOLERANCES["fp32"])}


def site_kernels(model: torch.nn.Module, inputs: tuple, folder: Path,
                 device: torch.device = CPU, tier: str = "triton") -> list[SiteKernel]:
    """The rules generator's first draft of `tier` for every site it writes kernels for."""
    table = find_sites(capture(model, inputs, device), GpuPeaks())
    generator = RulesGenerator()
    kernels = []
    for site in table.sites:
        problem = write_site_folder(site, folder, max_input_bytes=0) / "problem.py"
        drafts = generator.propose(problem, None, 1, tiers=(tier,)).children
        if drafts:
            kernels.append(SiteKernel(site.key, drafts[0].source, problem.read_text()))
    return kernels


def assert_close(actual: object, expected: object, where: str) -> None:
    comparison = compare_outputs(actual, expected, FP32)
    assert comparison.mismatch is None, f"{where}: {comparison.mismatch.message}"


@pytest.mark.parametrize("name", [*FACTORIES, "gpt2"])
def test_installed_kernels_keep_the_model_correct(name, tmp_path):
    model, inputs = model_and_inputs(name)
    kernels = site_kernels(model, inputs, tmp_path)
    assert kernels, f"no site of {name} got a kernel"
    torch._dynamo.reset()
    installed = install(model, kernels, rest="eager")
    with torch.no_grad():
        expected = model(*inputs)
        actual = installed(*inputs)
    assert_close(actual, expected, name)
    ran = {call.split(": ")[0] for call, n in installed.stats().items()
           if call.endswith(": kernel") and n}
    assert ran == {k.key for k in kernels}, installed.stats()


def test_the_rest_goes_to_inductor_and_the_kernels_still_run(tmp_path):
    model, inputs = models.make_mlp()
    kernels = site_kernels(model, inputs, tmp_path)
    torch._dynamo.reset()
    installed = install(model, kernels, rest="inductor")
    with torch.no_grad():
        assert_close(installed(*inputs), model(*inputs), "mlp under inductor")
    assert sum(n for call, n in installed.stats().items() if call.endswith(": kernel")) \
        == len(kernels)


def test_with_no_kernels_the_model_runs_as_it_is_or_as_torch_compile_makes_it():
    model, inputs = models.make_mlp()
    torch._dynamo.reset()
    as_is = install(model, [], rest="eager")
    assert as_is.compiled is model
    compiled = install(model, [], rest="inductor")
    assert isinstance(compiled.compiled, torch._dynamo.eval_frame.OptimizedModule)
    assert compiled.compiled._orig_mod is model
    with torch.no_grad():
        assert_close(compiled(*inputs), model(*inputs), "mlp under torch.compile")
    assert compiled.replaced == [] and compiled.stats() == {}


class Scaled(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * 3


def guarded(kernel: torch.nn.Module) -> tuple[GuardedKernel, Counter]:
    calls: Counter[str] = Counter()
    proven = [ProvenInput((4, 8), (8, 1), "torch.float32")]
    return GuardedKernel("pointwise-test", kernel, Scaled(), proven, calls), calls


def test_the_guard_sends_calls_the_kernel_was_not_proven_for_to_pytorch():
    class Marked(torch.nn.Module):  # distinguishable from the reference on purpose
        def forward(self, x):
            return x * 3 + 1000

    guard, calls = guarded(Marked())
    x = torch.randn(4, 8)
    assert torch.equal(guard(x), x * 3 + 1000), "a proven call did not reach the kernel"
    for other, why in [(torch.randn(5, 8), "shape"), (torch.randn(8, 4).t(), "stride"),
                       (torch.randn(4, 8, dtype=torch.float64), "dtype")]:
        assert torch.equal(guard(other), other * 3), f"an unproven {why} reached the kernel"
    assert calls == {"pointwise-test: kernel": 1, "pointwise-test: fallback (unproven call)": 3}


def test_a_kernel_failing_at_run_time_falls_back_and_is_reported():
    class Failing(torch.nn.Module):
        def forward(self, x):
            raise RuntimeError("out of resources: shared memory")

    guard, calls = guarded(Failing())
    x = torch.randn(4, 8)
    assert torch.equal(guard(x), x * 3)
    assert torch.equal(guard(x), x * 3)
    assert guard.failure == "RuntimeError: out of resources: shared memory"
    reason = ("pointwise-test: fallback (kernel failed: RuntimeError: out of resources: "
              "shared memory)")
    assert calls == {reason: 2}, "the failed kernel was called again"


FAILING_KERNEL = '''
import torch.nn as nn


class ModelNew(nn.Module):
    def forward(self, *args):
        raise RuntimeError("launch failed: too many resources requested")
'''


def test_an_installed_kernel_that_fails_is_reported_and_the_model_stays_right(tmp_path):
    model, inputs = models.make_mlp()
    kernels = site_kernels(model, inputs, tmp_path)
    broken = SiteKernel(kernels[0].key, FAILING_KERNEL, kernels[0].problem_source)
    torch._dynamo.reset()
    installed = install(model, [broken, *kernels[1:]], rest="eager")
    with torch.no_grad():
        assert_close(installed(*inputs), model(*inputs), "mlp with a failing kernel")
    assert installed.failures() == {
        broken.key: "RuntimeError: launch failed: too many resources requested"}


def test_training_is_out_of_scope_and_says_so(tmp_path):
    model, inputs = models.make_mlp()
    kernels = site_kernels(model, inputs, tmp_path)
    torch._dynamo.reset()
    installed = install(model, kernels, rest="eager")
    with pytest.warns(UserWarning, match="for inference"):
        out = installed(*inputs)
    assert out.requires_grad, "with autograd on, the original model (with its graph) runs"
    assert installed.stats() == {}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with torch.inference_mode():
            installed(*inputs)
    assert sum(installed.stats().values()) == len(kernels)


def test_the_proven_inputs_are_the_site_problems(tmp_path):
    model, inputs = models.make_mlp()
    kernel = site_kernels(model, inputs, tmp_path)[0]
    problem = import_problem(next(tmp_path.glob(f"{kernel.key}/problem.py")))
    expected = [ProvenInput.of(t) for t in problem.get_inputs()]
    assert kernel.proven() == expected
