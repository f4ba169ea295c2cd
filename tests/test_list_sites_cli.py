"""`python -m core.optimize MODEL --list-sites`: the ranked table, its JSON, and bad input."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from core.profile.site_table import print_site_table

ROOT = Path(__file__).resolve().parents[1]


def run_cli(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "core.optimize", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)


def test_json_report_ranks_sites_and_accounts_for_the_model_time(tmp_path):
    result = run_cli("examples/mlp_block.py", "--list-sites", "--device", "cpu", "--json",
                     "--warmup", "1", "--trials", "3", "--out", str(tmp_path))
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["device"] == "cpu" and "CPU" in report["timing"]
    assert report["total_ms"] > 0
    sites = report["sites"]
    # The example's norm only feeds its first projection: one matmul site normalizes its rows.
    assert [s["family"] for s in sites] == ["matmul", "matmul"]
    for site in sites:
        assert set(site) >= {"id", "family", "signature", "calls", "share", "time_ms", "floor_ms"}
        assert 0 <= site["share"] <= 1.5 and site["calls"] == 1 and site["floor_ms"] > 0
        assert Path(site["problem"]).is_file()
    times = [s["time_ms"] for s in sites]
    assert times == sorted(times, reverse=True)
    assert report["accounted_ms"] > 0
    assert report["floor_ms"] == pytest.approx(sum(s["floor_ms"] for s in sites))
    assert "profiling forwards" in result.stderr  # progress goes to stderr, JSON to stdout


def test_table_is_printed_for_people(tmp_path):
    result = run_cli("tests.models:make_resnet", "--list-sites", "--device", "cpu",
                     "--warmup", "0", "--trials", "2", "--out", str(tmp_path))
    assert result.returncode == 0, result.stderr
    assert "conv2d → batch_norm → add → relu" in result.stdout
    assert "kept with PyTorch" in result.stdout
    assert "the sites' roofline floors summed" in result.stdout
    assert "runs at" not in result.stdout, "a CPU time set against a GPU's floor"
    written = list((tmp_path / "tests.models-make_resnet" / "sites").glob("*/problem.py"))
    assert len(written) == sum(result.stdout.count(f" {family} ")
                               for family in ("conv", "reduction", "other", "matmul"))


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["missing_model.py"], "no such file"),
        (["tests/models.py"], "not a KernelBench-format file"),
        (["tests.models:make_raising"], "checkpoint missing"),
        (["tests.models:make_returns_nothing"], "no tensor"),
        (["torchvision:resnet_nonexistent"], "torchvision"),
        (["hf:no_such_architecture"], "no model type"),
        (["hf:gpt2?n_layer=2&n_embd=128"], "must be divisible by num_heads"),
        (["tests.models:make_fixed_precision", "--dtype", "fp16"], "under --dtype fp16"),
        (["examples/mlp_block.py", "--tiers", "ptx"], "unknown tier"),
    ],
)
def test_bad_input_is_one_message_and_exit_code_2(args, message, tmp_path):
    result = run_cli(*args, "--list-sites", "--device", "cpu", "--out", str(tmp_path))
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    assert message in result.stderr and "fix:" in result.stderr
    assert result.stdout == ""


def test_a_gpu_table_says_how_near_the_captured_program_runs_to_its_floor():
    site = {"share": 0.8, "time_ms": 4.0, "floor_ms": 1.5, "family": "reduction", "calls": 1,
            "id": "reduction-1", "signature": "softmax"}
    report = {"model": "m", "dtype": "fp32", "device": "cuda", "timing": "GPU", "total_ms": 5.0,
              "latency_ms": 5.1, "captured_ms": 5.0, "graphs": 1, "floor_gpu": "H200",
              "sites": [site, {**site, "id": "reduction-2", "floor_ms": 0.5}], "kept_ms": 0.5,
              "outside_ms": 0.5, "accounted_ms": 5.0, "floor_ms": 2.0}
    out = io.StringIO()
    print_site_table(report, out)
    assert ("floor 2.0000 ms, the sites' roofline floors summed: the captured program runs at "
            "40.0% of it") in out.getvalue()
