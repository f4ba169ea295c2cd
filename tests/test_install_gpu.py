"""Installed kernels on a GPU: Triton and CUDA (pycuda) kernels as custom ops inside an
inductor-compiled model, ordered with torch's own work on its current stream."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from core.evaluate.correctness import compare_outputs
from core.profile.roofline import GpuPeaks
from core.profile.sites import find_sites, write_site_folder
from core.runtime.capture import capture
from core.runtime.guarded import SiteKernel
from core.runtime.install import install
from generators.site_graph import load_site_graph
from generators.triton.program import compiled_drafts, write_compiled
from tests import models
from tests.test_install import site_kernels

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]
CUDA = torch.device("cuda")


def on_gpu(factory):
    model, inputs = factory()
    return model.to(CUDA), tuple(x.to(CUDA) for x in inputs)


@pytest.mark.parametrize(("factory", "tier"), [
    (models.make_mlp, "triton"), (models.make_resnet, "cuda"), (models.make_resnet, "triton")])
def test_installed_kernels_are_right_under_inductor_on_a_side_stream(factory, tier, tmp_path):
    model, inputs = on_gpu(factory)
    kernels = site_kernels(model, inputs, tmp_path, CUDA, tier)
    assert kernels, f"no {tier} kernel for any site"
    torch._dynamo.reset()
    installed = install(model, kernels, rest="inductor")
    with torch.inference_mode():
        expected = model(*inputs)
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):  # the kernels must follow torch onto this stream
            actual = installed(*inputs)
        torch.cuda.current_stream().wait_stream(stream)
        torch.cuda.synchronize()
    # Matmuls and convs run in tf32 on the GPU (Triton's tl.dot, cuDNN): the tf32 tolerance.
    comparison = compare_outputs(actual, expected, {torch.float32: ("tf32", 3e-4)})
    assert comparison.mismatch is None, comparison.mismatch.message
    assert kernel_calls(installed) >= len(kernels), installed.stats()


@pytest.mark.parametrize("factory", [models.make_mlp, models.make_resnet])
def test_triton_kernels_are_traced_and_launched_by_inductor(factory, tmp_path):
    """On a GPU the Triton kernels go into inductor's graph: no call of Kiln's ops reaches
    the dispatcher, the kernels still run, and the model stays right."""
    model, inputs = on_gpu(factory)
    kernels = site_kernels(model, inputs, tmp_path, CUDA, "triton")
    torch._dynamo.reset()
    installed = install(model, kernels, rest="inductor")
    with torch.inference_mode():
        expected = model(*inputs)
        installed(*inputs)
        first_run = kernel_calls(installed)
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                                torch.profiler.ProfilerActivity.CUDA]) as prof:
            actual = installed(*inputs)
            torch.cuda.synchronize()
    assert installed.untraceable == {}, installed.untraceable
    comparison = compare_outputs(actual, expected, {torch.float32: ("tf32", 3e-4)})
    assert comparison.mismatch is None, comparison.mismatch.message
    names = [e.name for e in prof.events()]
    assert not [n for n in names if n.startswith("kiln::")], "a site ran through its op"
    launched = {n for n in names if "kernel" in n and not n.startswith("triton_")}
    assert launched, f"no Kiln kernel was launched: {sorted(set(names))[:20]}"
    # Counted per run, traced too: a kernel serves every call site of its site (ResNet repeats
    # some), so a run makes at least one call per kernel and the second run as many as the first.
    assert first_run >= len(kernels), installed.stats()
    assert kernel_calls(installed) == 2 * first_run, installed.stats()


def test_kilns_own_convolutions_are_traced_into_inductor(tmp_path):
    """Each conv site's first draft with Kiln's own convolution (`generators.triton.conv_gemm`): its
    launcher and kernel go into inductor's graph like any Triton kernel, and stay right."""
    model, inputs = on_gpu(models.make_resnet)
    kernels = []
    for site in find_sites(capture(model, inputs, CUDA), GpuPeaks()).sites:
        problem = write_site_folder(site, tmp_path, max_input_bytes=0) / "problem.py"
        graph = load_site_graph(problem)
        if graph.family == "conv":
            schedule = replace(compiled_drafts(graph)[0][0], library_layout="gemm")
            kernels.append(SiteKernel(site.key, write_compiled(graph, schedule),
                                      problem.read_text()))
    assert kernels, "no conv site"
    torch._dynamo.reset()
    installed = install(model, kernels, rest="inductor")
    with torch.inference_mode():
        expected = model(*inputs)
        actual = installed(*inputs)
        torch.cuda.synchronize()
    comparison = compare_outputs(actual, expected, {torch.float32: ("tf32", 3e-4)})
    assert comparison.mismatch is None, comparison.mismatch.message
    assert installed.untraceable == {}, installed.untraceable
    assert kernel_calls(installed) >= len(kernels), installed.stats()


class ConvNormMean(torch.nn.Module):
    def __init__(self, dims: int) -> None:
        super().__init__()
        self.conv = (torch.nn.Conv3d if dims == 3 else torch.nn.Conv2d)(3, 8, 3)
        self.norm = torch.nn.GroupNorm(4, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(self.conv(x)).mean(dim=1)


@pytest.mark.parametrize(("dims", "layout"), [(3, "channels_last"), (2, ""), (2, "channels_last")])
def test_a_traced_convolution_keeps_the_layout_its_kernel_was_judged_on(dims, layout, tmp_path):
    """Inductor's layout optimization would convolve in strides of its own and copy the output
    into those the kernel reads: the only kernels inductor adds are its copies of the inputs."""
    model = ConvNormMean(dims).to(CUDA).eval()
    inputs = (torch.randn((4, 3) + (12,) * dims, device=CUDA),)
    site = next(s for s in find_sites(capture(model, inputs, CUDA), GpuPeaks()).sites
                if s.family == "conv")
    problem = write_site_folder(site, tmp_path, max_input_bytes=0) / "problem.py"
    graph = load_site_graph(problem)
    schedule = replace(compiled_drafts(graph)[0][0], library_layout=layout)
    kernel = SiteKernel(site.key, write_compiled(graph, schedule), problem.read_text())
    torch._dynamo.reset()
    installed = install(model, [kernel], rest="inductor")
    with torch.inference_mode():
        expected = model(*inputs)
        installed(*inputs)
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            actual = installed(*inputs)
            torch.cuda.synchronize()
    comparison = compare_outputs(actual, expected, {torch.float32: ("tf32", 3e-4)})
    assert comparison.mismatch is None, comparison.mismatch.message
    assert installed.untraceable == {}, installed.untraceable
    inductors = {e.name for e in prof.events() if e.name.startswith("triton_")}
    assert all("clone" in name for name in inductors), sorted(inductors)
    assert kernel_calls(installed) == 2, installed.stats()


def kernel_calls(installed) -> int:
    return sum(n for call, n in installed.stats().items() if call.endswith(": kernel"))
