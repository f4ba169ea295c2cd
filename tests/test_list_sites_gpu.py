"""On a GPU: the site table is timed with CUDA events and its parts add up to the model."""

from __future__ import annotations

import pytest
import torch

from core.profile.in_situ import ProfileConfig
from core.profile.load import load_model
from core.profile.pipeline import ListSitesConfig, list_sites
from core.profile.roofline import GpuPeaks
from core.profile.sites import find_sites
from core.runtime.capture import capture

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize(("model", "dtype"), [("bench/problems/transformer_block.py", "bf16"),
                                             ("examples/mlp_block.py", "fp32")])
def test_cuda_site_table_accounts_for_the_model_time(model, dtype, tmp_path):
    """A model of milliseconds, and the bundled example, tens of microseconds, where the marks
    between segments are a large part of every gap (bench/NOTES.md, profiler accounting on
    small models)."""
    report = list_sites(ListSitesConfig(model=model, device="cuda", dtype=dtype,
                                        out=tmp_path, profile=ProfileConfig(5, 30), quiet=True))
    assert "CUDA events" in report["timing"]
    assert report["device"] == "cuda"
    assert abs(report["accounted_ms"] / report["captured_ms"] - 1) < 0.10
    assert all(s["floor_ms"] > 0 for s in report["sites"])


def test_cuda_site_problems_reproduce_the_captured_values():
    device = torch.device("cuda")
    loaded = load_model("examples/mlp_block.py", device, dtype="bf16")
    table = find_sites(capture(loaded.model, loaded.inputs, device), GpuPeaks())
    namespace: dict = {}
    for site in table.sites:
        exec(compile(site.problem.source, site.key, "exec"), namespace)
        with torch.no_grad():
            out = namespace["Model"]()(*site.example_inputs)
        torch.testing.assert_close(out, site.example_outputs[0], rtol=0, atol=0)
