"""A run-level step that fails (the end-to-end check out of memory, a site's baseline) ends
the run as failed, with no traceback: the store, report.md and the JSON are still written,
and one message says what was kept."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import torch

from core.optimize import run as run_module
from core.optimize.config import OptimizeConfig
from core.optimize.run import OptimizeRun
from core.profile.in_situ import ProfileConfig
from core.profile.pipeline import ListSitesConfig
from core.profile.progress import Progress
from store import open_reader
from tests.test_list_sites_cli import ROOT


def optimize_out_of_memory_in(function: str, tmp_path: Path, *arguments: str
                              ) -> subprocess.CompletedProcess:
    """`python -m core.optimize` on the small MLP, with `function` (a module's attribute, named
    `module.attribute`) raising CUDA's out-of-memory error as a GPU would."""
    module, _, attribute = function.rpartition(".")
    script = (f"import sys, torch, {module}\n"
              "def out_of_memory(*args, **kwargs):\n"
              "    raise torch.OutOfMemoryError('CUDA out of memory. Tried to allocate 2.00 GiB')\n"
              f"{module}.{attribute} = out_of_memory\n"
              "from core.optimize.cli import main\n"
              "from core.runtime.errors import exit_on_input_error\n"
              "exit_on_input_error(lambda: main(sys.argv[1:]))\n")
    return subprocess.run(
        [sys.executable, "-c", script, "tests.models:make_mlp", "--device", "cpu", "--db",
         str(tmp_path / "kiln.db"), "--out", str(tmp_path / "out"), *arguments],
        cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True,
        timeout=300)


def test_out_of_memory_in_the_end_to_end_check_keeps_the_run(tmp_path):
    db = tmp_path / "kiln.db"
    result = optimize_out_of_memory_in(
        "core.optimize.e2e.time_model", tmp_path, "--json", "--max-candidates", "2", "--sites",
        "1", "--workers", "1", "--trials", "2", "--warmup", "0", "--no-site-compile")
    assert result.returncode == 1, result.stderr
    assert "Traceback" not in result.stderr
    message = result.stderr.splitlines()[-1]
    assert message.startswith("kiln: run 1 failed while checking the model end to end: "
                              "OutOfMemoryError: CUDA out of memory")
    assert f"kept: 2 judged kernel(s) in {db}" in message
    report = json.loads(result.stdout)
    assert report["status"] == "failed" and report["searched"][0]["evaluations"] == 2
    assert report["e2e"] == {"error": "OutOfMemoryError: CUDA out of memory. Tried to "
                                      "allocate 2.00 GiB"}
    text = Path(report["report_md"]).read_text()
    assert "Not done: OutOfMemoryError" in text and "**The run failed** while checking" in text
    with open_reader(db) as reader:
        run = reader.run(1)
        assert (run.status, run.e2e) == ("failed", {**report["e2e"],
                                                    "failure": report["failure"]})
        assert len(reader.candidates(run_id=1)) == 2


def test_out_of_memory_while_profiling_is_one_message(tmp_path):
    result = optimize_out_of_memory_in("core.profile.pipeline.capture", tmp_path)
    assert result.returncode == 1, result.stderr
    assert "Traceback" not in result.stderr
    assert result.stderr.splitlines()[-1] == (
        "kiln: tests.models:make_mlp did not fit in the GPU's free memory while it was profiled "
        "(OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB); nothing was "
        "stored; free the GPU (other runs, say), then run again")


def run_with_baselines_raising(error: Exception, tmp_path: Path, monkeypatch) -> tuple[
        dict, OptimizeConfig]:
    def broken(problem: Path, config: object, compile: bool = True) -> None:
        raise error

    monkeypatch.setattr(run_module, "time_site", broken)
    profile = ListSitesConfig(model="tests.models:make_mlp", device="cpu",
                              out=tmp_path / "out", profile=ProfileConfig(0, 2), quiet=True)
    config = OptimizeConfig(profile=profile, db=tmp_path / "kiln.db", max_candidates=2,
                            sites=1, tiers=("triton",))
    return OptimizeRun(config, Progress(enabled=False)).execute(), config


def test_a_site_whose_baselines_run_out_of_memory_is_left_out_with_why(tmp_path, monkeypatch):
    report, config = run_with_baselines_raising(
        torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 9.00 GiB"), tmp_path,
        monkeypatch)
    why = ("ran out of device memory timing its PyTorch baselines: OutOfMemoryError: CUDA out "
           "of memory. Tried to allocate 9.00 GiB")
    assert (report["status"], report["failure"]) == ("done", "")
    searched = report["searched"][0]
    assert (searched["evaluations"], searched["declined"]) == (0, why)
    assert report["e2e"]["installed"] == []
    with open_reader(config.db) as reader:
        assert reader.run(1).status == "done"
        assert [s.declined for s in reader.sites(1) if s.key == searched["id"]] == [why]


def test_a_baseline_that_fails_otherwise_fails_the_run_with_its_report(tmp_path, monkeypatch):
    report, config = run_with_baselines_raising(
        RuntimeError("compiling the site failed"), tmp_path, monkeypatch)
    assert report["status"] == "failed"
    assert report["failure"] == ("while timing the sites' baselines: RuntimeError: compiling "
                                 "the site failed")
    assert report["e2e"] is None and report["searched"][0]["evaluations"] == 0
    with open_reader(config.db) as reader:
        assert reader.run(1).status == "failed"
        assert reader.run(1).e2e == {"failure": report["failure"]}
