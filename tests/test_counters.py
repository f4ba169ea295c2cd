"""Nsight Compute counters: the parser on output recorded on an H200, and `collect` running
ncu as a subprocess: its command line, a machine where it cannot read counters, a hung run.

ncu cannot run here (no GPU); where `collect` needs it, a small executable script stands in for
it, named by KILN_NCU, and plays back the recorded output or one of ncu's failures."""

from __future__ import annotations

import os
import stat
import tempfile
import time
from pathlib import Path

import pytest

from core.evaluate.counters import (
    METRICS,
    CounterReport,
    KernelCounters,
    collect,
    ncu_command,
    parse_ncu_csv,
)

DATA = Path(__file__).parent / "data" / "ncu"

# The best rules kernel of three sites, profiled on an H200 with `bench/counters_bench.py`
# on 2026-12-02 (ncu 2025.3.1): name, duration ns, DRAM %, SM %, achieved occupancy %,
# L2 hit %, registers, grid, the largest stall reason.
RECORDED = {
    "pointwise": ("pointwise_kernel", 103904.0, 49.66, 77.16, 33.13, 50.05, 73, 8192,
                  "long_scoreboard"),
    "reduction": ("row_kernel", 127616.0, 83.72, 33.49, 68.87, 50.6, 38, 8192,
                  "long_scoreboard"),
    "matmul": ("matmul_kernel", 245568.0, 19.68, 60.4, 12.48, 73.41, 255, 512, "dispatch_stall"),
}


@pytest.mark.parametrize("site", sorted(RECORDED))
def test_the_recorded_output_of_each_site_parses(site):
    kernels = parse_ncu_csv((DATA / f"{site}.csv").read_text())
    name, duration, dram, sm, occupancy, l2, registers, grid, stall = RECORDED[site]
    assert [k.name for k in kernels] == [name]
    kernel = kernels[0]
    assert (kernel.duration_ns, kernel.dram_pct, kernel.sm_pct) == (duration, dram, sm)
    assert (kernel.achieved_occupancy_pct, kernel.l2_hit_pct) == (occupancy, l2)
    assert (kernel.registers, kernel.grid_size) == (registers, grid)
    assert kernel.sector_use_pct == 100.0 and kernel.theoretical_occupancy_pct is not None
    assert kernel.dram_bytes and kernel.dram_bytes > 1e8  # bytes, not scaled to MB
    assert kernel.top_stalls(1)[0][0] == stall


def test_every_figure_is_read_and_stalls_exclude_issuing():
    kernel = parse_ncu_csv((DATA / "reduction.csv").read_text())[0]
    missing = [figure for figure in METRICS if getattr(kernel, figure) is None]
    assert not missing, f"figures ncu was asked for but the parser did not read: {missing}"
    assert "selected" not in kernel.stalls and "not_selected" not in kernel.stalls
    assert len(kernel.stalls) >= 10
    shares = [share for _, share in kernel.top_stalls(len(kernel.stalls))]
    assert shares == sorted(shares, reverse=True) and sum(shares) == pytest.approx(1.0)


def test_numbers_with_thousands_separators_and_missing_cells():
    header = '"ID","Kernel Name","gpu__time_duration.sum","dram__bytes.sum"'
    text = "\n".join(["==PROF== Connected to process 1", "program output", header,
                      '"","","ns","byte"', '"0","k1","1,234","n/a"', '"1","k2","10",""'])
    kernels = parse_ncu_csv(text)
    assert [(k.name, k.duration_ns, k.dram_bytes) for k in kernels] == [
        ("k1", 1234.0, None), ("k2", 10.0, None)]


def test_output_without_a_table_has_no_kernels():
    assert parse_ncu_csv("==ERROR== ERR_NVGPUCTRPERM\n") == []


def test_the_report_survives_the_store_and_names_its_longest_kernel():
    report = CounterReport([KernelCounters("short", duration_ns=5.0),
                            KernelCounters("long", duration_ns=50.0, stalls={"wait": 1.0})],
                           ["a note"], 9.5)
    again = CounterReport.from_dict(report.to_dict())
    assert again == report and again.dominant.name == "long"
    assert CounterReport().dominant is None


def test_ncu_leaves_the_clocks_alone_and_profiles_one_forward(tmp_path):
    command = ncu_command("ncu", tmp_path / "p.py", tmp_path / "c.py", 3, "/tmp/gpu-0.lock")
    joined = " ".join(command)
    assert "--clock-control none" in joined and "--profile-from-start off" in joined
    assert "--print-units base" in joined and "--csv --page raw" in joined
    program = command[command.index("-m") + 1:]
    assert program[:3] == ["core.evaluate.counters", str(tmp_path / "p.py"), str(tmp_path / "c.py")]
    assert command[command.index("--seed") + 1] == "3"
    assert command[command.index("--lock") + 1] == "/tmp/gpu-0.lock"


def fake_ncu(folder: Path, script: str) -> Path:
    path = folder / "ncu"
    path.write_text("#!/bin/sh\n" + script)
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return path


@pytest.fixture
def files(tmp_path: Path) -> tuple[Path, Path]:
    return tmp_path / "problem.py", tmp_path / "candidate.py"


def test_collect_reads_what_ncu_prints(tmp_path, files, monkeypatch):
    argv = tmp_path / "argv.txt"
    ncu = fake_ncu(tmp_path, f'echo "$@" > {argv}\ncat {DATA / "pointwise.csv"}\n')
    monkeypatch.setenv("KILN_NCU", str(ncu))
    report = collect(*files, seed=0, timeout_s=30)
    assert [k.name for k in report.kernels] == ["pointwise_kernel"] and not report.notes
    assert "--clock-control none" in argv.read_text()
    assert report.seconds > 0


def test_the_profiled_kernels_compile_into_caches_they_may_write(tmp_path, files, monkeypatch):
    """The profiled process writes only in the temporary folder: Triton's and pycuda's caches
    must be there, not in a home folder the walls keep it out of."""
    seen = tmp_path / "caches.txt"
    ncu = fake_ncu(tmp_path, f'echo "$TRITON_CACHE_DIR $PYCUDA_CACHE_DIR" > {seen}\n'
                             f'cat {DATA / "pointwise.csv"}\n')
    monkeypatch.setenv("KILN_NCU", str(ncu))
    collect(*files, seed=0, timeout_s=30)
    triton_cache, pycuda_cache = (Path(p) for p in seen.read_text().split())
    assert triton_cache.parent == pycuda_cache.parent != Path(".")
    assert triton_cache.parent.parent == Path(tempfile.gettempdir())
    assert not triton_cache.parent.exists(), "the caches go with the profile"


def test_a_machine_where_ncu_cannot_read_counters_gets_a_note(tmp_path, files, monkeypatch):
    ncu = fake_ncu(tmp_path, 'echo "==ERROR== ERR_NVGPUCTRPERM - The user does not have '
                             'permission to access NVIDIA GPU Performance Counters"\nexit 1\n')
    monkeypatch.setenv("KILN_NCU", str(ncu))
    report = collect(*files, seed=0, timeout_s=30)
    assert report.kernels == []
    assert report.notes[0].startswith("ncu cannot read the hardware counters on this machine")
    assert "ERR_NVGPUCTRPERM" in report.notes[0]


def test_a_failing_ncu_is_reported_with_its_exit_code(tmp_path, files, monkeypatch):
    monkeypatch.setenv("KILN_NCU", str(fake_ncu(tmp_path, "echo boom\nexit 3\n")))
    report = collect(*files, seed=0, timeout_s=30)
    assert report.notes[0].startswith("ncu exited with code 3") and "boom" in report.notes[0]


def test_a_hung_ncu_is_killed_at_the_time_limit(tmp_path, files, monkeypatch):
    marker = tmp_path / "child.pid"
    # A child that outlives ncu's shell would keep running if only ncu were killed.
    ncu = fake_ncu(tmp_path, f"sleep 60 &\necho $! > {marker}\nwait\n")
    monkeypatch.setenv("KILN_NCU", str(ncu))
    began = time.monotonic()
    report = collect(*files, seed=0, timeout_s=1)
    assert time.monotonic() - began < 20
    assert report.notes == ["ncu gave no counters within 1s and was killed"]
    child = int(marker.read_text())
    for _ in range(50):
        try:
            os.kill(child, 0)
        except ProcessLookupError:
            break
        time.sleep(0.1)
    else:
        pytest.fail("ncu's child process survived the time limit")


def test_no_ncu_and_no_gpu_say_so(files, monkeypatch):
    monkeypatch.delenv("KILN_NCU", raising=False)
    monkeypatch.setenv("PATH", "/nonexistent")
    monkeypatch.setattr("core.evaluate.counters.glob.glob", lambda pattern: [])
    monkeypatch.setattr("core.evaluate.counters.Path.exists", lambda self: False)
    assert "KILN_NCU" in collect(*files, seed=0, timeout_s=5).notes[0]
    assert collect(*files, seed=0, timeout_s=5, device="cpu").notes == [
        "hardware counters need a CUDA device; this run is on cpu"]
