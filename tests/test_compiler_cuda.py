"""The kernel compiler's CUDA backend: every case of `compiler_cases` under each schedule compiles
for sm_90 with nvcc (one translation unit, so the whole set costs one compiler run), and matches
PyTorch, run on the CPU by `tests.cuda_on_cpu` and on a GPU, each also with its rows kept in
shared memory or registers and walked a vector of columns at a time, and on the GPU with
thread-block clusters and with rows shared by blocks meeting at a barrier in global memory
(which the CPU's stand-in does not run)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from core.runtime.cuda import nvcc_check
from generators.base import Parent
from generators.compiler.schedule import Schedule
from generators.cuda.expressions import HELPERS
from generators.cuda.folds import CLUSTER_EXCHANGE, FOLDS, GRID_EXCHANGE, VECTORS
from generators.cuda.program import write_cuda_program
from generators.rules import RulesGenerator
from generators.site_graph import Unsupported
from tests.compiler_cases import (
    ALL_CASES,
    CLUSTERED,
    GRIDDED,
    KEPT,
    TRITON_ONLY_SCANS,
    VECTOR_CASES,
    VECTORED,
    Case,
    check,
    load_module,
    schedules_of,
    write_problem,
)
from tests.cuda_on_cpu import kernels_on_cpu

# Scans in the CUDA tier are sums; running products, extremes and log-sums stay with Triton.
CUDA_CASES = [case for case in ALL_CASES
              if not any(kind in case.body for kind in TRITON_ONLY_SCANS)] + VECTOR_CASES
# The CUDA tier's own schedules beside each case's drafts.
CUDA_SCHEDULES = KEPT + VECTORED


def _kernels(folder: Path, n: int, case: Case) -> list[tuple[str, str]]:
    """Each schedule's kernels for `case` without the shared helpers, renamed apart, each with
    what it is."""
    _, program = write_problem(folder, case)
    found = []
    for k, schedule in enumerate(schedules_of(program, CUDA_SCHEDULES + CLUSTERED + GRIDDED)):
        path = folder / f"kernel_{k}.py"
        path.write_text(write_cuda_program(program, schedule, case.body))
        source = load_module(path, f"cuda_{folder.name}_{n}_{k}").SOURCE
        kernels = (source.removeprefix(HELPERS + FOLDS).removeprefix(VECTORS)
                   .removeprefix(CLUSTER_EXCHANGE).removeprefix(GRID_EXCHANGE))
        assert kernels != source, "every compiled CUDA source starts with the shared helpers"
        found.append((f"{case.id} under {schedule.describe()}",
                      kernels.replace("site_kernel_", f"case{n}_{k}_site_kernel_")))
    return found


def test_every_case_compiles_for_hopper(tmp_path):
    parts, starts = [HELPERS + FOLDS + VECTORS + CLUSTER_EXCHANGE + GRID_EXCHANGE], []
    for n, case in enumerate(CUDA_CASES):
        for what, kernels in _kernels(tmp_path / f"case{n}", n, case):
            starts.append((sum(p.count("\n") + 1 for p in parts) + 1, what))
            parts.append(kernels)
    ok, log = nvcc_check("\n".join(parts))
    # Errors, and warnings too (a value declared and never read, say): a kernel reads cleanly.
    found = []
    for match in re.finditer(r"kernel\.cu\((\d+)\): (error|warning)[^:]*: (.*)", log):
        line = int(match.group(1))
        what = max((s for s in starts if s[0] <= line), default=(0, "the helpers"))[1]
        found.append(f"{what}: {match.group(2)}: {match.group(3)}")
    if not ok or found:
        pytest.fail("nvcc found fault with compiled kernels:\n"
                    + "\n".join(found or [log[-3000:]]))


@pytest.mark.parametrize("kind", TRITON_ONLY_SCANS)
def test_a_running_value_other_than_a_sum_is_declined_with_the_reason(tmp_path, kind):
    case = next(c for c in ALL_CASES if kind in c.body)
    _, program = write_problem(tmp_path, case)
    with pytest.raises(Unsupported, match=f"{kind} in the CUDA tier"):
        write_cuda_program(program, Schedule(), case.body)


def test_the_candidate_states_its_launch_geometry(tmp_path):
    case = Case("x", "torch.softmax(x, dim=-1)", "torch.randn(300, 70)")
    _, program = write_problem(tmp_path, case)
    source = write_cuda_program(program, Schedule(4, 64, 4), case.body)
    # 4 rows of 32 lanes a block of 128 threads: 75 blocks cover the 300 rows.
    assert "grid=(75, 1, 1), block=(128, 1, 1)" in source
    assert "__launch_bounds__(128)" in source
    assert "constexpr int LANES = 32;" in source


def test_rows_side_by_side_in_memory_take_consecutive_threads(tmp_path):
    # A sum over the leading dimension: rows (the trailing 300) lie next to each other.
    leading = Case("x", "torch.sum(x, dim=0)", "torch.randn(70, 300)")
    _, program = write_problem(tmp_path / "leading", leading)
    source = write_cuda_program(program, Schedule(64, 32, 4), leading.body)
    assert "const long long raw_row = (long long)blockIdx.x * ROWS + threadIdx.x % ROWS;" in source
    assert "const int lane = threadIdx.x / ROWS;" in source
    assert "fold_rows_apart<LANES, ROWS>(" in source.split("__global__")[1]
    trailing = Case("x", "torch.sum(x, dim=1)", "torch.randn(300, 70)")
    _, program = write_problem(tmp_path / "trailing", trailing)
    source = write_cuda_program(program, Schedule(4, 64, 4), trailing.body)
    assert "threadIdx.x / LANES" in source and "ROWS" not in source.split("__global__")[1]


@pytest.mark.parametrize("case", CUDA_CASES, ids=[c.id for c in CUDA_CASES])
def test_every_case_matches_pytorch_run_on_the_cpu(tmp_path, case):
    with kernels_on_cpu():
        check(tmp_path / "site", case, write_cuda_program, extra=CUDA_SCHEDULES)


@pytest.mark.gpu
@pytest.mark.parametrize("case", CUDA_CASES, ids=[c.id for c in CUDA_CASES])
def test_every_case_matches_pytorch_on_the_gpu(tmp_path, case):
    check(tmp_path / "site", case, write_cuda_program, device="cuda",
          extra=CUDA_SCHEDULES + CLUSTERED + GRIDDED)


@pytest.mark.parametrize("tiers", [("cuda",), ("triton", "cuda")],
                         ids=["the CUDA tier alone", "CUDA opened beside Triton"])
def test_a_compiled_triton_kernel_seeds_the_cuda_tier_at_its_schedule(tmp_path, tiers):
    problem, _ = write_problem(tmp_path, Case("x", "torch.softmax(x, dim=-1)",
                                              "torch.randn(300, 70)"))
    generator = RulesGenerator()
    triton = [c for c in generator.propose(problem, None, n=20).children
              if c.settings["writer"] == "write_compiled"]
    chosen = triton[-1]
    cuda = generator.propose(problem, Parent(chosen), n=3, tiers=tiers).children
    assert [c.tier for c in cuda] == ["cuda"] * 3, "the newly opened tier's seeds come first"
    first = cuda[0]
    assert first.tier == "cuda" and first.settings["writer"] == "write_cuda_compiled"
    assert {k: v for k, v in first.settings.items() if k != "writer"} == {
        k: v for k, v in chosen.settings.items() if k != "writer"}
    assert first.rationale == "the parent's settings, written in this tier"
    assert "load_kernel(SOURCE" in first.source


def test_a_norms_sums_fold_together_through_one_trip_of_shared_memory(tmp_path):
    case = Case("x", "F.layer_norm(x, (24,))", "torch.randn(9, 24)")
    _, program = write_problem(tmp_path, case)
    kernel = write_cuda_program(program, Schedule(1, 8, 4), case.body).split("__global__")[1]
    # The shifted sum and the shifted squares: one fold of two, 32 slots each (the mean is taken
    # from them: test_compiler_variance_mean).
    assert len(re.findall(r"fold_row_all<LANES>\(fold\d+, Add\(\), fold_space\);", kernel)) == 1
    assert re.search(r"float fold\d+\[2\] = \{acc\d+, acc\d+\};", kernel)
    assert "fold_row<LANES>" not in kernel
    assert "__shared__ long long fold_space[64];" in kernel
