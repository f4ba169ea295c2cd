"""A run's settings: stored from its config, turned back into the same config on --resume,
with the search's flags given again taking their place and the profile's held."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta
from pathlib import Path

import pytest

from core.optimize.cli import _config, _parse
from core.optimize.config import OptimizeConfig, config_of_settings, minutes_spent, run_settings
from core.profile.in_situ import ProfileConfig
from core.profile.load import BuiltinShape
from core.profile.pipeline import ListSitesConfig
from core.profile.roofline import GpuPeaks
from core.runtime.errors import KilnInputError
from core.search.tree import SearchConfig
from store import Store

MODEL = "tests.models:make_mlp"


def started(tmp_path: Path) -> tuple[Path, OptimizeConfig]:
    """A store holding one run, started with settings far from the defaults."""
    db = tmp_path / "kiln.db"
    config = OptimizeConfig(
        profile=ListSitesConfig(model=MODEL, device="cpu", dtype="bf16", seed=3,
                                out=tmp_path / "out", shape=BuiltinShape(2, 16, 64),
                                profile=ProfileConfig(1, 4),
                                peaks=GpuPeaks("custom GPU", 3.35e12,
                                               {**GpuPeaks().matrix_flops, "bf16": 500e12},
                                               GpuPeaks().vector_flops,
                                               read_bandwidth=3.35e12),
                                max_input_bytes=8 * 2**20, allow_tf32=True),
        db=db, budget_minutes=3.0, max_candidates=8, sites=2, tiers=("triton",),
        cuda_share=0.2, search=SearchConfig(seed=3, strategy="random"), generators=("rules",),
        site_compile=False, e2e=False, feedback=False, counters=0)
    with Store.open(db) as store:
        store.start_run(model_spec=MODEL, model_hash="h", gpu="cpu", versions={},
                        config=run_settings(config))
    return db, config


def test_settings_turn_back_into_the_same_config(tmp_path):
    _, config = started(tmp_path)
    elsewhere = OptimizeConfig(profile=ListSitesConfig(model=MODEL, device="cuda"),
                               db=config.db)
    assert config_of_settings(run_settings(config), elsewhere) == config


def test_resume_rebuilds_the_runs_config(tmp_path):
    db, config = started(tmp_path)
    args = _parse(["--resume", "1", "--db", str(db), "--workers", "3"])
    resumed = _config(args)
    assert resumed == replace(config, workers=3, profile=replace(config.profile, quiet=False))


def test_search_flags_given_with_resume_replace_the_runs(tmp_path):
    db, _ = started(tmp_path)
    args = _parse(["--resume", "1", "--db", str(db), "--budget", "10", "--max-candidates",
                   "200", "--dtype", "bf16"])
    resumed = _config(args)
    assert (resumed.budget_minutes, resumed.max_candidates) == (10.0, 200)
    assert resumed.profile.dtype == "bf16" and resumed.sites == 2


@pytest.mark.parametrize(("flags", "problem"), [
    (["--dtype", "fp16"], "run 1 was profiled with --dtype bf16, not fp16"),
    (["--seq-len", "128"], "run 1 was profiled with --seq-len 16, not 128"),
    (["--list-sites"], "--resume continues a search"),
    (["examples/mlp_block.py"], f"run 1 optimized {MODEL}, not examples/mlp_block.py"),
])
def test_resume_refuses_what_would_change_the_runs_profile(tmp_path, flags, problem):
    db, _ = started(tmp_path)
    with pytest.raises(KilnInputError) as err:
        _parse(["--resume", "1", "--db", str(db), *flags])
    assert problem in err.value.problem


def test_minutes_spent_run_from_start_to_last_sign_of_life(tmp_path):
    db, _ = started(tmp_path)
    with Store.open(db) as store:
        run = store.run(1)
    five_later = (datetime.fromisoformat(run.started_at) + timedelta(minutes=5)).isoformat()
    assert minutes_spent(replace(run, finished_at=None, heartbeat_at=five_later)) \
        == pytest.approx(5.0)
    assert minutes_spent(replace(run, finished_at=five_later)) == pytest.approx(5.0)


def test_memory_gb_bounds_what_judging_holds_on_each_gpu():
    config = _config(_parse([MODEL, "--device", "cpu", "--memory-gb", "1.5"]))
    assert config.memory_gb == 1.5
    assert config.eval_config().memory_bytes == int(1.5 * 2**30)
    assert _config(_parse([MODEL, "--device", "cpu"])).eval_config().memory_bytes is None


def test_memory_gb_must_be_positive():
    with pytest.raises(KilnInputError, match="--memory-gb 0.0 is not positive"):
        _parse([MODEL, "--device", "cpu", "--memory-gb", "0"])
