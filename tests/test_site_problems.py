"""Each site problem, run on its own with its saved inputs, reproduces the model's values."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from core.profile.load import BuiltinShape, load_model
from core.profile.roofline import GpuPeaks
from core.profile.sites import find_sites, write_site_folder
from core.runtime.capture import capture
from tests import models

CPU = torch.device("cpu")
FACTORIES = {
    "mlp": models.make_mlp,
    "cnn": models.make_cnn,
    "data_dependent": models.make_data_dependent,
    "resnet": models.make_resnet,
    "stacked_mlp": models.make_stacked_mlp,
    "tuple_reductions": models.make_tuple_reductions,
}


def build(name: str) -> tuple[torch.nn.Module, tuple]:
    if name == "gpt2":
        loaded = load_model(models.GPT2_TINY, CPU, shape=BuiltinShape(batch=2, seq_len=16))
        return loaded.model, loaded.inputs
    return FACTORIES[name]()


def import_problem(path):
    spec = importlib.util.spec_from_file_location(f"problem_{path.parent.name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def assert_same(actual, expected, where: str) -> None:
    if isinstance(expected, torch.Tensor):
        assert actual.shape == expected.shape and actual.dtype == expected.dtype, where
        if not torch.equal(actual, expected):
            diff = (actual.double() - expected.double()).abs()
            index = tuple(int(i) for i in torch.nonzero(diff == diff.max())[0])
            raise AssertionError(f"{where}: max |diff| {diff.max().item():.3g} at {index}: "
                                 f"{actual[index].item()} vs {expected[index].item()}")
    else:
        assert actual == expected, where


@pytest.mark.parametrize("name", [*FACTORIES, "gpt2"])
def test_site_problem_reproduces_intermediates(name, tmp_path):
    model, inputs = build(name)
    captured = capture(model, inputs, CPU)
    table = find_sites(captured, GpuPeaks())
    assert table.sites, "no sites found"
    for site in table.sites:
        folder = write_site_folder(site, tmp_path, max_input_bytes=2**30)
        problem = import_problem(folder / "problem.py")
        assert problem.get_init_inputs() == []
        saved = torch.load(folder / "inputs.pt", weights_only=True)
        with torch.no_grad():
            out = problem.Model()(*saved)
        outs = out if isinstance(out, tuple) and len(site.example_outputs) > 1 else (out,)
        assert len(outs) == len(site.example_outputs)
        for i, (actual, expected) in enumerate(zip(outs, site.example_outputs, strict=True)):
            assert_same(actual, expected, f"{site.key} output {i} ({site.problem.signature})")


@pytest.mark.parametrize("name", ["mlp", "resnet"])
def test_generated_inputs_match_captured_layout(name, tmp_path):
    model, inputs = build(name)
    table = find_sites(capture(model, inputs, CPU), GpuPeaks())
    for site in table.sites:
        problem = import_problem(write_site_folder(site, tmp_path, 2**30) / "problem.py")
        drawn = problem.get_inputs()
        for fresh, real in zip(drawn, site.example_inputs, strict=True):
            assert fresh.shape == real.shape and fresh.dtype == real.dtype
            assert fresh.stride() == real.stride()
            if real.is_floating_point() and real.numel() > 1:
                assert real.min() <= fresh.min() and fresh.max() <= real.max()
        with torch.no_grad():
            problem.Model()(*drawn)


def test_large_inputs_are_described_not_saved(tmp_path):
    model, inputs = models.make_mlp()
    table = find_sites(capture(model, inputs, CPU), GpuPeaks())
    folder = write_site_folder(table.sites[0], tmp_path, max_input_bytes=16)
    assert not (folder / "inputs.pt").exists()
    meta = (folder / "site.json").read_text()
    assert '"inputs_saved": false' in meta and '"shape"' in meta


def test_a_reduction_with_two_results_is_a_site_returning_tensors(tmp_path):
    model, inputs = models.make_tuple_reductions()
    table = find_sites(capture(model, inputs, CPU), GpuPeaks())
    signatures = sorted(site.problem.signature.split(" | ")[0] for site in table.sites)
    assert signatures == ["max → getitem", "relu → min → getitem → getitem → mul"], signatures
    assert not table.unwritable


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64, torch.bool])
def test_an_inputs_moments_are_taken_in_chunks_as_of_the_whole(monkeypatch, dtype):
    from core.runtime import site_problem

    values = (torch.randn(1000, 37, generator=torch.Generator().manual_seed(3)) * 5 + 2)
    value = values.to(dtype) if dtype is not torch.bool else values > 2
    whole = value.double().reshape(-1)
    monkeypatch.setattr(site_problem, "MOMENT_CHUNK", 999)  # 38 chunks, the last a short one
    spec = site_problem.InputSpec.of(value)
    expected = (whole.mean().item(), whole.std().item(), whole.min().item(), whole.max().item())
    got = (spec.mean, spec.std, spec.low, spec.high)
    assert got == pytest.approx(expected, rel=1e-12, abs=1e-12), (dtype, got, expected)


def test_an_input_with_nan_has_finite_moments():
    from core.runtime.site_problem import InputSpec

    spec = InputSpec.of(torch.tensor([1.0, float("nan"), 3.0]))
    assert (spec.mean, spec.std, spec.low, spec.high) == (0.0, 0.0, 0.0, 0.0)


def test_a_profiled_model_lets_go_of_its_captured_values(tmp_path):
    # Held for the whole run, a large model's captured outputs would keep their size of the GPU.
    from core.profile.in_situ import ProfileConfig
    from core.profile.pipeline import ListSitesConfig, profile_sites

    profiled = profile_sites(ListSitesConfig(model="tests.models:make_mlp", device="cpu",
                                             out=tmp_path, profile=ProfileConfig(0, 2),
                                             quiet=True))
    assert profiled.table.sites
    for site in profiled.table.sites:
        assert site.example_inputs == [] and site.example_outputs == [], site.key
        # What they were for is written: the problem and the inputs it was captured with.
        folder = tmp_path / profiled.loaded.name / "sites" / site.key
        assert (folder / "problem.py").exists() and (folder / "inputs.pt").exists()
        # Nor does any graph keep the copy of its first call's inputs the values came from,
        # though the profile ran every graph again after.
        for call_site in site.call_sites:
            graph = call_site.graph
            assert graph.first_inputs is None and graph.invocations > 1, graph.index


class _ColumnLoss(torch.nn.Module):
    """A site reading a column of its input: a view strided by the row's length."""

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.cosine_embedding_loss(y, x, torch.sign(x[:, 0]))


def test_saved_inputs_keep_the_layout_the_site_was_written_for(tmp_path):
    x, y = torch.randn(16, 300), torch.randn(16, 300)
    table = find_sites(capture(_ColumnLoss(), (x, y), CPU), GpuPeaks())
    strided = [s for s in table.sites if any(not t.is_contiguous() for t in s.example_inputs)]
    assert strided, "no site reads the column as a strided input"
    for site in strided:
        folder = write_site_folder(site, tmp_path, 2**30)
        saved = torch.load(folder / "inputs.pt", weights_only=True)
        problem = import_problem(folder / "problem.py")
        for kept, real, drawn in zip(saved, site.example_inputs, problem.get_inputs(),
                                     strict=True):
            assert kept.stride() == real.stride() == drawn.stride()
            assert torch.equal(kept, real)


def test_a_column_of_a_large_matrix_is_not_saved_past_the_limit(tmp_path):
    x, y = torch.randn(16, 300), torch.randn(16, 300)
    table = find_sites(capture(_ColumnLoss(), (x, y), CPU), GpuPeaks())
    site = next(s for s in table.sites if any(not t.is_contiguous() for t in s.example_inputs))
    column = next(t for t in site.example_inputs if not t.is_contiguous())
    # The column's 16 values reach 4501 of the matrix's storage: that is what a copy keeping
    # its strides holds, and what the limit is held against.
    reached = (1 + 15 * 300) * 4
    others = sum(t.numel() * 4 for t in site.example_inputs if t is not column)
    folder = write_site_folder(site, tmp_path, max_input_bytes=reached + others - 1)
    assert not (folder / "inputs.pt").exists()
