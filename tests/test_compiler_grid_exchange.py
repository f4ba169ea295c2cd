"""Rows too long for a cluster's shared memory (a group norm's 8 MB groups) shared by blocks
anywhere on the GPU: each block keeps its share on chip, stores its partial results in global
memory and waits at the row's barrier for the others' (`Schedule.grid_blocks`), in one
cooperative launch. The GPU tests need an NVIDIA GPU (sm_90); the CPU's stand-in for CUDA runs
blocks one after another, so that blocks waiting for each other never meet there."""

from __future__ import annotations

import re

import pytest
import torch

from core.runtime.cuda import load_kernel, nvcc_check
from generators.compiler.schedule import KEPT_ROW, Schedule, cuda_drafts
from generators.compiler.site import program_of
from generators.cuda.folds import GRID_EXCHANGE
from generators.cuda.program import write_cuda_compiled
from generators.mutations import neighbours
from generators.site_graph import Unsupported, load_site_graph
from generators.triton.program import write_compiled
from tests.cuda_on_cpu import load_kernel as load_kernel_on_cpu
from tests.kernel_checks import assert_matches, one_input_problem

# Two groups of 1048576 values (4 MB): a sixteenth of one is past a block's shared memory.
GROUP_NORM = ("torch.nn.functional.group_norm(x, 2)", (2, 8, 512, 512))
SOFTMAX = ("torch.softmax(x, dim=-1)", (4, 1048576))


def _problem(tmp_path, body: str, shape: tuple[int, ...]):
    return one_input_problem(tmp_path, body, f"torch.randn{shape}")


def _kernel_of(tmp_path, body: str, shape: tuple[int, ...]):
    program = program_of(load_site_graph(_problem(tmp_path, body, shape)))
    return max(program.steps, key=lambda s: s.kernel.row_count * s.kernel.column_count).kernel


def test_groups_too_long_for_a_cluster_are_shared_by_blocks_of_the_gpu_first(tmp_path):
    kernel = _kernel_of(tmp_path, *GROUP_NORM)
    found = cuda_drafts(kernel)
    gridded = [(s, why) for s, why in found if s.grid_blocks]
    # Groups of 1 M values: shared by 132 blocks, a 32 KB share each, four blocks of 512
    # threads an SM (the most threads an SM runs); then by 66, three an SM (their 64 KB shares).
    assert [(s.grid_blocks, s.resident_per_sm) for s, _ in gridded] == [(132, 4), (66, 3)]
    assert found[:2] == gridded, "the only schedules that keep such rows come first"
    for schedule, why in gridded:
        share = -(-kernel.longest_loop // schedule.grid_blocks)
        assert share <= KEPT_ROW and schedule.keep_row and schedule.held == "shared"
        assert (schedule.num_warps, schedule.block_columns) == (16, 8192), why
        rows = schedule.resident_per_sm * 132 // schedule.grid_blocks
        assert f"{rows} rows at a time, one row's blocks reading while another's wait" in why


def test_a_share_past_half_an_sm_leaves_its_block_alone_there(tmp_path):
    # Groups of 2 M values (35_GroupNorm's): 132 blocks a row, three an SM, first; then 44
    # blocks alone on their SMs (190 KB shares), 1024 threads with 16 columns each in flight.
    kernel = _kernel_of(tmp_path, "torch.nn.functional.group_norm(x, 2)", (2, 8, 512, 1024))
    gridded = [s for s, _ in cuda_drafts(kernel) if s.grid_blocks]
    assert [(s.grid_blocks, s.resident_per_sm) for s in gridded] == [(132, 3), (44, 1)]
    assert (gridded[1].num_warps, gridded[1].block_columns) == (32, 16 * 1024)


def test_a_row_shared_over_the_gpu_is_one_cooperative_launch(tmp_path):
    graph = load_site_graph(_problem(tmp_path, *GROUP_NORM))
    source = write_cuda_compiled(graph, Schedule(1, 4096, 32, resident_per_sm=1, keep_row=True,
                                                 grid_blocks=22))
    # The mean and the variance meet at one barrier, past which every block folds the 22
    # partial results of each in the same order.
    assert source.count("row_barrier(&arrivals[row], 22);") == 1
    assert source.count("__ldcg(&ws") == 3 and "int* __restrict__ arrivals" in source
    assert "arrivals0 = torch.zeros((4,)" in source, "counts start from zero every call"
    assert "grid=(min(4, max(1, 1 * sms // 22)), 22, 1)" in source
    assert "('site_kernel_0_0', 'PPPPPP', True)" in source, "launched cooperatively"
    assert "cooperative=cooperative" in source
    # The share is kept in shared memory and read there by the second walk.
    assert re.search(r"const float x\d+ = kept\[", source), "the second walk reads the share"
    assert "shared_mem=196608" in source


def test_each_level_waits_for_every_block_again(tmp_path):
    # logsumexp's sum reads its (guarded) max: two levels, two barriers a row.
    graph = load_site_graph(_problem(tmp_path, "torch.logsumexp(x, dim=-1)", SOFTMAX[1]))
    source = write_cuda_compiled(graph, Schedule(1, 4096, 32, keep_row=True, grid_blocks=44))
    # One counter a row over the launch: the second barrier waits for twice the blocks.
    assert "row_barrier(&arrivals[row], 44);" in source
    assert "row_barrier(&arrivals[row], 88);" in source
    # A softmax's max and sum meet at one barrier (an online sum).
    (tmp_path / "softmax").mkdir()
    graph = load_site_graph(_problem(tmp_path / "softmax", *SOFTMAX))
    source = write_cuda_compiled(graph, Schedule(1, 4096, 32, keep_row=True, grid_blocks=44))
    assert source.count("row_barrier(&arrivals[row], ") == 1


def test_only_a_reductions_rows_are_shared_over_the_gpu(tmp_path):
    chosen = Schedule(4, 64, 4, splits=2, cluster_blocks=4, grid_blocks=22)
    for body, shared in (("torch.cumsum(x, dim=-1)", False), ("x * 2.0", False),
                         ("x / torch.norm(x, p=2, dim=1, keepdim=True)", True)):
        kernel = _kernel_of(tmp_path, body, (8, 300))
        fitted = chosen.fitted(kernel)
        assert fitted.grid_blocks == (22 if shared else 0), body
        if shared:  # in place of split launches and clusters; a row a block, striding
            assert (fitted.split_count(kernel), fitted.splits, fitted.cluster_blocks,
                    fitted.block_rows, fitted.resident_per_sm) == (22, 1, 0, 1, 1)


def test_triton_declines_a_row_shared_over_the_gpu_with_the_reason(tmp_path):
    graph = load_site_graph(_problem(tmp_path, *SOFTMAX))
    with pytest.raises(Unsupported, match="blocks meeting at a barrier, and rows kept"):
        write_compiled(graph, Schedule(1, 4096, 16, grid_blocks=22))


def test_the_search_moves_the_blocks_of_a_row_a_rung_at_a_time():
    steps = [s for s in neighbours(Schedule(grid_blocks=44)) if s.knob == "grid_blocks"]
    assert sorted(s.settings.grid_blocks for s in steps) == [33, 66]
    assert not [s for s in neighbours(Schedule()) if s.knob == "grid_blocks"]


# The blocks of a row: each stores round times its index, meets the others at the row's barrier,
# writes the sum of what they all stored, and meets them again before the next round's stores;
# two rounds, so that the row's k-th barrier waits for k times its blocks.
BARRIER = GRID_EXCHANGE + r"""
__global__ void __launch_bounds__(64) meet(int* slots, int* sums, int* arrivals) {
    const int row = blockIdx.x, blocks = gridDim.y;
    for (int round = 1; round <= 2; ++round) {
        if (threadIdx.x == 0) slots[row * blocks + blockIdx.y] = round * blockIdx.y;
        row_barrier(&arrivals[row], (2 * round - 1) * blocks);
        int total = 0;
        for (int b = 0; b < blocks; ++b) total += __ldcg(&slots[row * blocks + b]);
        if (threadIdx.x == 0) sums[(round - 1) * gridDim.x * blocks + row * blocks + blockIdx.y]
            = total;
        row_barrier(&arrivals[row], 2 * round * blocks);
    }
}
"""


def test_the_rows_barrier_compiles_for_hopper_without_a_warning():
    ok, log = nvcc_check(BARRIER)
    assert ok and "warning" not in log, log[-2000:]


def test_the_cpu_stand_in_refuses_blocks_that_wait_for_each_other():
    with pytest.raises(NotImplementedError, match="runs on a GPU only"):
        load_kernel_on_cpu(BARRIER, "meet", "PPP", cooperative=True)


@pytest.mark.gpu
def test_blocks_of_a_cooperative_launch_meet_at_a_rows_barrier():
    rows, blocks = 3, 40
    slots = torch.zeros(rows * blocks, dtype=torch.int32, device="cuda")
    sums = torch.zeros(2 * rows * blocks, dtype=torch.int32, device="cuda")
    arrivals = torch.zeros(rows, dtype=torch.int32, device="cuda")
    kernel = load_kernel(BARRIER, "meet", "PPP", cooperative=True)
    kernel(grid=(rows, blocks, 1), block=(64, 1, 1), args=(slots, sums, arrivals))
    expected = sum(range(blocks))
    assert sums.view(2, -1).tolist() == [[expected] * rows * blocks,
                                         [2 * expected] * rows * blocks]
    # More blocks than can be resident at once: the driver refuses the launch, and says so.
    with pytest.raises(RuntimeError, match="launching meet cooperatively"):
        kernel(grid=(1000, 1000, 1), block=(64, 1, 1), args=(slots, sums, arrivals))


@pytest.mark.gpu
@pytest.mark.parametrize("blocks", [22, 33])
@pytest.mark.parametrize(("body", "shape"), [GROUP_NORM, SOFTMAX], ids=["group norm", "softmax"])
def test_rows_shared_over_the_gpu_match_pytorch_call_after_call(tmp_path, body, shape, blocks):
    problem = _problem(tmp_path, body, shape)
    candidate = write_cuda_compiled(load_site_graph(problem),
                                    Schedule(1, 4096, 32, resident_per_sm=1, keep_row=True,
                                             grid_blocks=blocks))
    namespace: dict = {}
    exec(compile(candidate, "model_new.py", "exec"), namespace)
    model = namespace["ModelNew"]()
    reference = eval(f"lambda x: {body}")
    x = torch.randn(shape, device="cuda")
    for _ in range(2):  # the barriers' counts start from zero at every call
        assert_matches(model(x), reference(x), candidate[:300])
