"""A run's example inputs wait in host memory while its search needs the GPU, and come back to
the model's device for the end-to-end check."""

from __future__ import annotations

from pathlib import Path

import torch

from core.evaluate.site_baseline import time_site
from core.optimize import run as run_module
from core.optimize.config import OptimizeConfig
from core.optimize.run import OptimizeRun
from core.profile.in_situ import ProfileConfig
from core.profile.load import LoadedModel
from core.profile.pipeline import ListSitesConfig
from core.profile.progress import Progress


def test_moving_inputs_moves_every_tensor_and_keeps_the_rest():
    inputs = (torch.ones(3), {"mask": torch.zeros(2, dtype=torch.bool), "scale": 0.5},
              [torch.arange(4)], "tag")
    loaded = LoadedModel("spec", "name", torch.nn.Identity(), inputs, torch.device("cpu"))
    loaded.move_inputs("meta")
    moved = loaded.inputs
    assert [moved[0].device.type, moved[1]["mask"].device.type, moved[2][0].device.type] == [
        "meta"] * 3
    assert (moved[1]["mask"].dtype, moved[2][0].dtype) == (torch.bool, torch.int64)
    assert (moved[1]["scale"], moved[3]) == (0.5, "tag")


def test_a_run_parks_its_inputs_through_the_search(tmp_path, monkeypatch):
    where: list[str] = []
    move = LoadedModel.move_inputs

    def noting_move(self: LoadedModel, device: torch.device | str) -> None:
        where.append(f"inputs to {torch.device(device).type}")
        move(self, device)

    def noting_baselines(problem: Path, config: object, compile: bool = True) -> object:
        where.append("site baselines")
        return time_site(problem, config, compile)

    monkeypatch.setattr(LoadedModel, "move_inputs", noting_move)
    monkeypatch.setattr(run_module, "time_site", noting_baselines)
    profile = ListSitesConfig(model="tests.models:make_mlp", device="cpu",
                              out=tmp_path / "out", profile=ProfileConfig(0, 2), quiet=True)
    config = OptimizeConfig(profile=profile, db=tmp_path / "kiln.db", max_candidates=1,
                            sites=1, tiers=("triton",), site_compile=False)
    report = OptimizeRun(config, Progress(enabled=False)).execute()
    assert report["status"] == "done" and report["e2e"]["correct"]
    # Parked after profiling, back on the model's device (this run's is the CPU) for the check.
    assert where == ["inputs to cpu", "site baselines", "inputs to cpu"]
