"""The sites plus the ops kept with PyTorch reproduce the whole model's output."""

from __future__ import annotations

import pytest
import torch

from core.profile.load import BuiltinShape, load_model
from core.profile.roofline import GpuPeaks
from core.profile.sites import find_sites, write_site_folder
from core.runtime.capture import capture
from core.runtime.stitch import stitching_backend
from tests import models
from tests.test_site_problems import FACTORIES, assert_same, import_problem

CPU = torch.device("cpu")


def model_and_inputs(name: str):
    if name == "gpt2":
        loaded = load_model(models.GPT2_TINY, CPU, shape=BuiltinShape(batch=2, seq_len=16))
        return loaded.model, loaded.inputs
    return FACTORIES[name]()


@pytest.mark.parametrize("name", [*FACTORIES, "gpt2"])
def test_sites_and_kept_ops_reproduce_the_model(name, tmp_path):
    model, inputs = model_and_inputs(name)
    with torch.no_grad():
        expected = model(*inputs)
    table = find_sites(capture(model, inputs, CPU), GpuPeaks())
    problems = {}
    for site in table.sites:
        folder = write_site_folder(site, tmp_path, max_input_bytes=0)
        problems[site.key] = import_problem(folder / "problem.py").Model()
    used: list[str] = []
    torch._dynamo.reset()
    stitched = torch.compile(model, backend=stitching_backend(problems, used), dynamic=False)
    with torch.no_grad():
        actual = stitched(*inputs)
    assert set(used) == set(problems), "some sites were never called in the rebuilt model"
    expected_leaves = torch.utils._pytree.tree_leaves(expected)
    actual_leaves = torch.utils._pytree.tree_leaves(actual)
    assert len(actual_leaves) == len(expected_leaves)
    for i, (a, e) in enumerate(zip(actual_leaves, expected_leaves, strict=True)):
        assert_same(a, e, f"{name} output leaf {i}")


def test_replacing_a_site_changes_only_its_call_sites():
    model, inputs = models.make_stacked_mlp()
    table = find_sites(capture(model, inputs, CPU), GpuPeaks())
    up = next(s for s in table.sites if s.problem.ops == ("linear", "gelu"))
    namespace: dict = {}
    exec(up.problem.source, namespace)
    reference = namespace["Model"](*namespace["get_init_inputs"]())

    class Doubled(torch.nn.Module):
        def forward(self, *args):
            return 2 * reference(*args)

    used: list[str] = []
    torch._dynamo.reset()
    stitched = torch.compile(model, backend=stitching_backend({up.key: Doubled()}, used))
    with torch.no_grad():
        out = stitched(*inputs)
        expected = model(*inputs)
    assert used == [up.key] * 3
    assert not torch.allclose(out, expected)
