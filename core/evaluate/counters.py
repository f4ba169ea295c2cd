"""Hardware counters of a candidate's kernels, read by Nsight Compute.

`collect` runs `ncu` on a small program (this module's `main`) that builds the candidate as the
judge does, runs one forward to compile and warm it, then one more between
`cudaProfilerStart` and `cudaProfilerStop`; with `--profile-from-start off` ncu profiles exactly
that forward's kernels. `--clock-control none` leaves the card's clocks alone, so the counters
describe the kernel at the clocks it is timed at. The run is bounded by a time limit and killed
with its process group past it.

Where ncu is missing, cannot read the counters (no permission, a sandboxed driver) or runs out
of time, the report holds no kernels and a note that says why; the diagnosis then rests on the
static kernel report alone.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import glob
import io
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from core.evaluate.child_env import REPO_ROOT, child_env

NOTE_CHARS = 1500  # of ncu's output kept in a note

# What each figure is read from. Percentages are of the peak sustained rate over the kernel's
# elapsed cycles, as Nsight Compute's Speed Of Light and Occupancy sections show them.
METRICS = {
    "duration_ns": "gpu__time_duration.sum",
    "dram_pct": "dram__throughput.avg.pct_of_peak_sustained_elapsed",
    "dram_bytes": "dram__bytes.sum",
    "sm_pct": "sm__throughput.avg.pct_of_peak_sustained_elapsed",
    "achieved_occupancy_pct": "sm__warps_active.avg.pct_of_peak_sustained_active",
    "theoretical_occupancy_pct": "sm__maximum_warps_per_active_cycle_pct",
    "l2_hit_pct": "lts__t_sector_hit_rate.pct",
    "sector_use_pct": "smsp__sass_average_data_bytes_per_sector_mem_global_op_ld.pct",
    "registers": "launch__registers_per_thread",
    "block_size": "launch__block_size",
    "grid_size": "launch__grid_size",
}
# Warp stall reasons: warps stalled for the reason per issued instruction, one metric a reason.
STALL_PREFIX = "smsp__average_warps_issue_stalled_"
STALL_SUFFIX = "_per_issue_active.ratio"
STALL_METRICS = f"regex:{STALL_PREFIX}.*{STALL_SUFFIX.replace('.', '[.]')}"
# The reason "selected" is a warp being issued, not a stall.
NOT_STALLS = frozenset({"selected", "not_selected"})
# Signs in ncu's output that it cannot read counters on this machine.
NO_COUNTER_SIGNS = ("ERR_NVGPUCTRPERM", "LibraryNotLoaded", "Failed to initialize the profiler",
                    "not supported on this device", "Failed to profile")


@dataclass
class KernelCounters:
    """One profiled kernel launch. None: ncu did not report the figure for it."""

    name: str
    duration_ns: float | None = None
    dram_pct: float | None = None
    dram_bytes: float | None = None
    sm_pct: float | None = None
    achieved_occupancy_pct: float | None = None
    theoretical_occupancy_pct: float | None = None
    l2_hit_pct: float | None = None
    sector_use_pct: float | None = None  # of each 32-byte sector global loads fetch, bytes used
    registers: float | None = None
    block_size: float | None = None
    grid_size: float | None = None
    stalls: dict[str, float] = field(default_factory=dict)  # reason → warps stalled per issue

    def top_stalls(self, count: int = 3) -> list[tuple[str, float]]:
        """The largest stall reasons with their share of all stalls, largest first."""
        total = sum(self.stalls.values())
        if total <= 0:
            return []
        ranked = sorted(self.stalls.items(), key=lambda item: -item[1])[:count]
        return [(reason, value / total) for reason, value in ranked]


@dataclass
class CounterReport:
    """Every kernel of one profiled forward, how long collecting took, and notes on gaps."""

    kernels: list[KernelCounters] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    seconds: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @staticmethod
    def from_dict(record: dict[str, Any]) -> CounterReport:
        return CounterReport([KernelCounters(**kernel) for kernel in record.get("kernels", [])],
                             list(record.get("notes", [])), float(record.get("seconds", 0.0)))

    @property
    def dominant(self) -> KernelCounters | None:
        """The kernel that took longest: the one a diagnosis should be about."""
        timed = [k for k in self.kernels if k.duration_ns is not None]
        return max(timed, key=lambda k: k.duration_ns or 0.0) if timed else None


def number(text: str) -> float | None:
    """A CSV cell as a number; None for an empty or non-numeric cell ("n/a")."""
    cleaned = text.replace(",", "").strip()
    try:
        return float(cleaned)
    except ValueError:
        return None


def parse_ncu_csv(text: str) -> list[KernelCounters]:
    """Kernels from `ncu --csv --page raw` output: a header row, a units row, a row a kernel.
    Lines before the header (ncu's own `==PROF==` messages, the program's output) are skipped."""
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith('"ID",')), None)
    if start is None:
        return []
    rows = list(csv.reader(io.StringIO("\n".join(
        line for line in lines[start:] if line.startswith('"')))))
    header, body = rows[0], rows[1:]
    column = {name: index for index, name in enumerate(header)}
    kernels = []
    for row in body:
        if len(row) != len(header) or not row[column["ID"]].strip():
            continue  # the units row, or a line that is not part of the table
        kernel = KernelCounters(row[column["Kernel Name"]])
        for figure, metric in METRICS.items():
            if metric in column:
                setattr(kernel, figure, number(row[column[metric]]))
        for name, index in column.items():
            if name.startswith(STALL_PREFIX) and name.endswith(STALL_SUFFIX):
                reason = name[len(STALL_PREFIX):-len(STALL_SUFFIX)]
                value = number(row[index])
                if reason not in NOT_STALLS and value is not None:
                    kernel.stalls[reason] = value
        kernels.append(kernel)
    return kernels


def find_ncu() -> str | None:
    """`KILN_NCU`, else ncu on PATH, in the CUDA toolkit, or the newest Nsight Compute in /opt."""
    if os.environ.get("KILN_NCU"):
        return os.environ["KILN_NCU"]
    found = shutil.which("ncu") or next(
        (path for path in ["/usr/local/cuda/bin/ncu",
                           *sorted(glob.glob("/opt/nvidia/nsight-compute/*/ncu"), reverse=True)]
         if Path(path).exists()), None)
    return found


def ncu_command(ncu: str, problem_path: Path, candidate_path: Path, seed: int,
                lock_path: str | None = None) -> list[str]:
    return [ncu, "--profile-from-start", "off", "--clock-control", "none",
            "--target-processes", "application-only", "--csv", "--page", "raw",
            "--print-units", "base",
            "--metrics", ",".join([*METRICS.values(), STALL_METRICS]),
            sys.executable, "-m", "core.evaluate.counters", str(problem_path), str(candidate_path),
            "--seed", str(seed), *(["--lock", lock_path] if lock_path else [])]


def profile_caches(folder: Path) -> dict[str, str]:
    """Where the profiled process's kernel compilers keep their caches: Triton's and pycuda's
    must be writable behind its walls, so each gets a folder in `folder`, a temporary folder
    gone with the profile."""
    return {"TRITON_CACHE_DIR": str(folder / "triton"), "PYCUDA_CACHE_DIR": str(folder / "pycuda")}


def collect(problem_path: Path, candidate_path: Path, seed: int, timeout_s: float,
            device: str = "cuda", lock_path: str | None = None,
            save_output: Path | None = None) -> CounterReport:
    """The counters of one forward of the candidate, or a report whose notes say why none.
    `lock_path`: the device lock (`core.timing.model_timing.DeviceLock`) the profiled forward holds
    alone; `save_output`: where to keep ncu's whole output (to study it, or as test data)."""
    if device != "cuda":
        return CounterReport(notes=["hardware counters need a CUDA device; this run is on "
                                    f"{device}"])
    ncu = find_ncu()
    if ncu is None:
        return CounterReport(notes=["Nsight Compute (ncu) was not found on PATH, in "
                                    "/usr/local/cuda/bin or /opt/nvidia/nsight-compute; set "
                                    "KILN_NCU to its path for hardware counters"])
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="kiln-ncu-cache-") as cache:
        process = subprocess.Popen(
            ncu_command(ncu, problem_path, candidate_path, seed, lock_path),
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            env=child_env("cuda", profile_caches(Path(cache))), cwd=REPO_ROOT,
            start_new_session=True)
        try:
            output, _ = process.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.communicate()
            return CounterReport(notes=[f"ncu gave no counters within {timeout_s:g}s and was "
                                        "killed"], seconds=time.perf_counter() - started)
    seconds = time.perf_counter() - started
    if save_output is not None:
        save_output.write_text(output)
    kernels = parse_ncu_csv(output)
    if kernels and process.returncode == 0:
        return CounterReport(kernels, seconds=seconds)
    tail = output.strip()[-NOTE_CHARS:] or "(no output)"
    if any(sign in output for sign in NO_COUNTER_SIGNS):
        why = "ncu cannot read the hardware counters on this machine"
    elif process.returncode != 0:
        why = f"ncu exited with code {process.returncode}"
    else:
        why = "ncu profiled no kernel in the candidate's forward"
    return CounterReport(notes=[f"{why}:\n{tail}"], seconds=seconds)


def profiled_forward(problem_path: Path, candidate_path: Path, seed: int,
                     lock_path: str | None) -> None:
    """Build the candidate as the judge does, warm it (compiling its kernels) sharing the
    device as checks do, and run one forward under the profiler, holding the device alone. The
    candidate is confined first: writes only beside it, in the temporary folder (ncu's files,
    the compilers' caches) and to the GPU's devices."""
    import torch

    from core.evaluate.sandbox import device_paths, restrict_writes
    from core.evaluate.zygote import start_cuda
    from core.runtime import cuda as cuda_runtime
    from core.runtime.problem_loader import import_file, load_problem
    from core.timing.device_lock import DeviceLock

    sys.modules.setdefault("cuda_runtime", cuda_runtime)
    problem = load_problem(problem_path)
    # CUDA cannot start behind the walls (bench/NOTES.md, 2026-12-05 09:10-09:20 UTC: which
    # walls let CUDA start): it starts first, as in a candidate's process.
    start_cuda()
    # The compilers' caches (`profile_caches`; beside the candidate where none was given) are
    # made and named behind the walls, so that compiling there can write them.
    caches = [Path(os.environ.setdefault(name, default)) for name, default
              in profile_caches(candidate_path.parent / "caches").items()]
    for cache in caches:
        cache.mkdir(parents=True, exist_ok=True)
    # ncu's injected library talks to ncu over sockets of its own: TCP stays open here.
    restrict_writes([candidate_path.parent, Path(tempfile.gettempdir()), *caches,
                     *device_paths("cuda")], tcp=True)
    module = import_file(candidate_path, candidate_path.stem)
    device = torch.device("cuda")
    init = problem.init_inputs()
    lock = DeviceLock(lock_path)
    with lock.shared(), torch.no_grad():
        torch.manual_seed(seed)
        model = module.ModelNew(*init).to(device).eval()
        inputs = problem.inputs(seed, device)
        model(*inputs)
        torch.cuda.synchronize()
        with lock.exclusive():
            torch.cuda.profiler.start()
            model(*inputs)
            torch.cuda.synchronize()
            torch.cuda.profiler.stop()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Run one forward of a candidate under the CUDA profiler (for ncu).")
    parser.add_argument("problem", type=Path)
    parser.add_argument("candidate", type=Path)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--lock", help="the device lock to hold around the profiled forward")
    args = parser.parse_args(argv)
    profiled_forward(args.problem, args.candidate, args.seed, args.lock)
    return 0


if __name__ == "__main__":
    sys.exit(main())
