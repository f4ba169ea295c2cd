"""The compiler's schedules: a looped kernel whose rows are walked twice and whose input is
larger than L2 is first tried with one program per SM striding over the rows, so that a row's
second walk reads it from L2, and in the CUDA tier with each row shared by the blocks of a
thread-block cluster; the search moves those settings one rung at a time."""

from __future__ import annotations

import re

import pytest

from generators.codegen import SM_COUNT_LINE
from generators.compiler.launches import main_kernel
from generators.compiler.schedule import Schedule, cuda_drafts, drafts
from generators.compiler.site import program_of
from generators.cuda.program import write_cuda_compiled
from generators.mutations import neighbours
from generators.rules import RulesGenerator
from generators.site_graph import Unsupported, load_site_graph
from generators.triton.program import write_compiled
from tests.kernel_checks import assert_matches, one_input_problem, run_beside_problem

NORM = "x / torch.norm(x, p=2, dim=1, keepdim=True)"


def main_drafts(problem) -> list[tuple[Schedule, str]]:
    program = program_of(load_site_graph(problem))
    main = max(program.steps, key=lambda step: step.kernel.row_count * step.kernel.column_count)
    return drafts(main.kernel)


@pytest.mark.parametrize(("body", "shape", "strided"), [
    (NORM, "(4096, 65535)", True),  # 1 GB, each row walked for its norm, then for the outputs
    ("torch.softmax(x, dim=-1)", "(8192, 70000)", True),
    # 1.5 MB a row: a row on each SM is already more than L2 holds
    ("torch.softmax(x, dim=-1)", "(512, 393216)", False),
    (NORM, "(64, 65535)", False),  # 16 MB: L2 holds every row in flight already
    ("x.sum(dim=-1)", "(4096, 65535)", False),  # one walk a row: nothing to find in L2
])
def test_rows_walked_twice_beyond_l2_stride_one_program_per_sm(tmp_path, body, shape, strided):
    problem = one_input_problem(tmp_path, body, f"torch.randn{shape}")
    schedules = main_drafts(problem)
    first, why = schedules[0]
    assert (first.resident_per_sm == 1) is strided, schedules
    if strided:
        assert "L2" in why and first.block_columns < 65535
        assert all(s.resident_per_sm == 0 for s, _ in schedules[1:])


def test_a_strided_candidate_counts_the_sms_and_loops_over_its_blocks(tmp_path):
    problem = one_input_problem(tmp_path, NORM, "torch.randn(4096, 65535)")
    source = write_compiled(load_site_graph(problem), Schedule(1, 4096, 16, resident_per_sm=1))
    assert f"device = in0.device\n        {SM_COUNT_LINE}" in source
    assert "[(min(4096, 1 * sms), 1)]" in source and "PASSES=-(-4096 // min(4096, 1 * sms))" \
        in source
    assert "for each" in source and "in range(PASSES):" in source
    proposals = RulesGenerator().propose(problem, None, n=3).children
    assert proposals[0].settings["resident_per_sm"] == 1, [p.rationale for p in proposals]


def test_the_search_moves_the_programs_per_sm_a_rung_at_a_time():
    ones = {s.settings.resident_per_sm for s in neighbours(Schedule(resident_per_sm=1))
            if s.knob == "resident_per_sm"}
    assert ones == {2}
    everyone = [s for s in neighbours(Schedule()) if s.knob == "resident_per_sm"]
    assert [s.settings.resident_per_sm for s in everyone] == [4]
    assert "L2" in everyone[0].rationale


R, S = "registers", "shared"
# Kept in registers twice: at 64 values a thread and at 40 or fewer, by the fewest threads.
SHARED_AND_KEPT = [(8, True, S), (8, True, R), (8, True, R), (8, False, S),
                   (4, True, S), (4, True, R), (4, True, R), (4, False, S)]


@pytest.mark.parametrize(("body", "shape", "cuda_only"), [
    (NORM, "(4096, 65535)", SHARED_AND_KEPT),  # rows of 256 KB: too long for one block to keep
    # 1.5 MB rows, too long for a row on every SM, shared by sixteen SMs first (an eighth of
    # one, 196 KB, leaves its block alone on its SM); a quarter (384 KB) is more than a block's
    # shared memory keeps, and an eighth more values a thread than stay in registers
    ("torch.softmax(x, dim=-1)", "(512, 393216)",
     [(16, True, S), (16, True, R), (16, True, R), (16, False, S), (8, True, S), (8, False, S),
      (4, False, S)]),
    # 125 KB rows, kept whole by one block (64 values a thread: registers still hold them);
    # 32 MB in all, which L2 holds
    ("torch.log_softmax(x, dim=-1)", "(256, 32000)", [(0, True, S), (0, True, R)]),
    (NORM, "(64, 65535)", []),  # 16 MB: L2 holds every row in flight already
    ("x.sum(dim=-1)", "(4096, 65535)", []),  # one walk a row
    ("torch.softmax(x, dim=-1)", "(65536, 4096)", []),  # rows held whole in registers
    ("torch.cumsum(x, dim=-1)", "(4096, 65535)", []),  # a running total crosses the row
])
def test_the_cuda_tier_keeps_long_rows_on_chip_or_shares_them_over_a_cluster(
        tmp_path, body, shape, cuda_only):
    problem = one_input_problem(tmp_path, body, f"torch.randn{shape}")
    proposals = RulesGenerator().propose(problem, None, n=12, tiers=("cuda",)).children
    found = [(p.settings["cluster_blocks"], p.settings["keep_row"], p.settings["held"])
             for p in proposals
             if p.settings["writer"] == "write_cuda_compiled"
             and (p.settings["cluster_blocks"] or p.settings["keep_row"])]
    assert found == cuda_only, [p.rationale for p in proposals]
    triton = RulesGenerator().propose(problem, None, n=8).children
    assert not any(p.settings.get("cluster_blocks") or p.settings.get("keep_row")
                   for p in triton)


@pytest.mark.parametrize(("body", "shape", "warps"), [
    # an eighth of a 1.5 MB row, 196 KB a block: one block an SM (a quarter, 384 KB, is
    # drafted too, and declined by the writer); a sixteenth, 96 KB, two blocks an SM
    ("torch.softmax(x, dim=-1)", "(512, 393216)", {16: 16, 8: 32, 4: 32}),
    # 32 KB and 64 KB a block: several blocks an SM
    (NORM, "(4096, 65535)", {8: 16, 4: 16}),
])
def test_a_block_alone_on_its_sm_takes_every_thread_it_runs(tmp_path, body, shape, warps):
    program = program_of(load_site_graph(one_input_problem(tmp_path, body,
                                                           f"torch.randn{shape}")))
    main = max(program.steps, key=lambda step: step.kernel.row_count * step.kernel.column_count)
    kept = {s.cluster_blocks: (s.num_warps, why) for s, why in cuda_drafts(main.kernel)
            if s.keep_row and s.held == "shared"}
    assert {blocks: n for blocks, (n, _) in kept.items()} == warps, kept
    assert all(f"blocks of {32 * n} threads" in why for n, why in kept.values()), kept


@pytest.mark.parametrize(("body", "shape", "held"), [
    # A group of 65536 values, an eighth a block: 64 values a thread at 128 threads, 40 at
    # 256 (32 a thread: the fewest pairs of warps that hold 40 or fewer).
    ("torch.nn.functional.group_norm(x, 32)", "(16, 512, 64, 64)", {8: [(128, 64), (256, 32)],
                                                                    4: [(256, 64), (448, 40)]}),
    # A channel of 100352 values: 40 a thread fills 320 threads of an eighth exactly.
    ("torch.nn.functional.batch_norm(x, None, None, training=True)", "(32, 256, 56, 56)",
     {8: [(256, 52), (320, 40)], 4: [(448, 56), (640, 40)]}),
])
def test_shares_kept_in_registers_are_drafted_at_the_values_a_thread_that_ran_fastest(
        tmp_path, body, shape, held):
    graph = load_site_graph(one_input_problem(tmp_path, body, f"torch.randn{shape}"))
    found: dict[int, list[tuple[int, int]]] = {}
    for schedule, why in cuda_drafts(main_kernel(program_of(graph))):
        if schedule.held != "registers":
            continue
        threads = 32 * schedule.num_warps
        source = write_cuda_compiled(graph, schedule)
        values = int(re.search(r"float kept0\[(\d+)\];", source).group(1))
        found.setdefault(schedule.cluster_blocks, []).append((threads, values))
        assert f"blocks of {threads} threads" in why and f"__launch_bounds__({threads}, " in source
    assert found == held


def test_a_row_too_long_for_shared_memory_is_declined_with_the_fix(tmp_path):
    problem = one_input_problem(tmp_path, NORM, "torch.randn(4, 65535)")
    with pytest.raises(Unsupported, match="256 KB a block, more than sm_90 has: share each row"):
        write_cuda_compiled(load_site_graph(problem), Schedule(1, 4096, 16, keep_row=True))


def test_a_row_kept_in_registers_is_an_array_a_lane_walked_whole(tmp_path):
    problem = one_input_problem(tmp_path, NORM, "torch.randn(4096, 65535)")
    graph = load_site_graph(problem)
    # An eighth of a row a block, 512 threads: two passes of 8 values a thread.
    source = write_cuda_compiled(graph, Schedule(1, 4096, 16, cluster_blocks=8, keep_row=True,
                                                 held="registers"))
    assert "kept in registers" in source.split("\n")[0]
    assert "float kept0[16];" in source and "extern __shared__" not in source
    assert "shared_mem=" not in source
    # A fixed count of passes, unrolled, so that every index into the array is a constant.
    assert re.search(r"#pragma unroll\n\s*for \(int walk\d+ = 0; walk\d+ < 2;", source)
    with pytest.raises(Unsupported, match="128 values a thread, more than the 64 that stay in "
                                          "registers at 512 threads: keep them in shared"):
        write_cuda_compiled(graph, Schedule(1, 4096, 16, keep_row=True, held="registers"))


def test_a_clustered_candidate_exchanges_partial_results_in_one_launch(tmp_path):
    problem = one_input_problem(tmp_path, NORM, "torch.randn(4096, 65535)")
    graph = load_site_graph(problem)
    source = write_cuda_compiled(graph, Schedule(1, 4096, 16, cluster_blocks=8))
    assert "__cluster_dims__(1, 8, 1)" in source and "grid=(4096, 8, 1)" in source
    # The cluster's one barrier sees every block's exchange barrier set up before any block
    # sends; the norm's sums make one exchange, counted in on its own barrier; no workspace.
    body = source.split("__global__")[1]
    assert body.count("exchanges_open(arrivals);") == 1 and body.count("exchanges_ready();") == 1
    assert "__shared__ unsigned long long arrivals[1];" in body and "ws0" not in source
    assert body.count("wait_for_bytes(&arrivals[0]);") == 1
    # A row of 512 lanes sends to the 8 blocks from 8 lanes at once.
    assert "if (lane < CLUSTER) { send_to_block(" in body and "send_to_cluster<" not in body
    assert "cluster_barrier" not in source
    with pytest.raises(Unsupported, match="kept in shared memory are the CUDA tier's"):
        write_compiled(graph, Schedule(1, 4096, 16, cluster_blocks=8))


def test_a_row_of_fewer_lanes_than_the_cluster_sends_from_one_lane(tmp_path):
    problem = one_input_problem(tmp_path, NORM, "torch.randn(4096, 60)")
    source = write_cuda_compiled(load_site_graph(problem),
                                 Schedule(8, 64, 1, cluster_blocks=8))
    body = source.split("__global__")[1]
    assert "constexpr int LANES = 4;" in body
    assert "if (lane == 0) { send_to_cluster<CLUSTER>(" in body and "send_to_block" not in body


def test_a_cluster_shares_only_the_loops_of_a_reduction(tmp_path):
    # A scan's running total crosses its row, and an elementwise kernel has no loops to share.
    chosen = Schedule(1, 64, 4, splits=2, resident_per_sm=1, cluster_blocks=4)
    for body, clustered in (("torch.cumsum(x, dim=-1)", False), ("x * 2.0", False),
                            (NORM, True)):
        problem = one_input_problem(tmp_path, body, "torch.randn(8, 300)")
        program = program_of(load_site_graph(problem))
        kernel = max(program.steps, key=lambda step: step.kernel.row_count).kernel
        fitted = chosen.fitted(kernel)
        assert fitted.cluster_blocks == (4 if clustered else 0), body
        if clustered:  # the cluster in place of split launches and striding blocks
            assert (fitted.split_count(kernel), fitted.splits, fitted.resident_per_sm) == (4, 1, 0)


def test_the_search_moves_the_cluster_a_rung_at_a_time():
    steps = [s for s in neighbours(Schedule(cluster_blocks=8)) if s.knob == "cluster_blocks"]
    assert sorted(s.settings.cluster_blocks for s in steps) == [4, 16]
    assert not [s for s in neighbours(Schedule()) if s.knob == "cluster_blocks"]


def test_settings_a_kernel_cannot_take_write_the_source_without_them(tmp_path):
    # An elementwise kernel has no row to keep nor loops to share, so the generator's
    # "proposed before" finds these children (their header names the schedule as fitted).
    problem = one_input_problem(tmp_path, "x * 2.0 + 1.0", "torch.randn(64, 300)")
    graph = load_site_graph(problem)
    plain = write_cuda_compiled(graph, Schedule())
    assert write_cuda_compiled(graph, Schedule(keep_row=True)) == plain
    assert write_cuda_compiled(graph, Schedule(cluster_blocks=4)) == plain
    norm = one_input_problem(tmp_path, NORM, "torch.randn(64, 300)")
    kept = write_cuda_compiled(load_site_graph(norm), Schedule(keep_row=True))
    assert "kept in shared memory" in kept.split("\n")[0] and "kept[" in kept


@pytest.mark.parametrize(("body", "shape", "first"), [
    # 256 channels of 32 rows side by side: one read of a [32, 256] tile, one write.
    ("torch.softmax(x, dim=1)", "(32, 256, 64, 64)", Schedule(32, 256, 8)),
    ("torch.var(x, dim=0)", "(64, 4096)", Schedule(64, 64, 8)),
    # Rows of 2048 side by side: 16 of them would pass the tile, so they are walked.
    ("x.sum(dim=1)", "(64, 2048, 512)", None),
])
def test_short_rows_side_by_side_are_first_held_whole(tmp_path, body, shape, first):
    graph = load_site_graph(one_input_problem(tmp_path, body, f"torch.randn{shape}"))
    (schedule, why), *_ = drafts(main_kernel(program_of(graph)))
    if first is None:
        assert not why.startswith("persistent"), why
        return
    assert schedule == first and why.startswith("persistent rows side by side"), why
    kernel = write_compiled(graph, schedule)
    assert "acc" in kernel and kernel.count("tl.load(in0") == 1, kernel


@pytest.mark.parametrize(("body", "shape", "splits"), [
    # 8192 columns side by side: 128, 64 or 256 (the tall draft's) blocks of rows, fewer than two
    # for each of 132 SMs: split for four.
    ("torch.amax(x, dim=0)", "(8192, 8192)", (5, 9, 3)),
    # 32768 columns: the 64-row draft's 512 blocks (3.9 an SM) and the tall draft's 1024 fill
    # the GPU; the 128-row draft's 256 do not.
    ("x.sum(dim=1)", "(64, 2048, 512)", (1, 3, 1)),
    # 128 × 4095 columns: thousands of blocks of rows fill the GPU unsplit.
    ("x.mean(dim=1)", "(128, 4096, 4095)", (1, 1, 1)),
    # Rows of 256 are no longer than the tall draft's step: no tall draft.
    ("torch.softmax(x, dim=1)", "(32, 256, 64, 64)", (1, 1)),
])
def test_rows_side_by_side_are_walked_tall_and_split_to_fill_the_gpu(tmp_path, body, shape,
                                                                     splits):
    graph = load_site_graph(one_input_problem(tmp_path, body, f"torch.randn{shape}"))
    kernel = main_kernel(program_of(graph))
    walked = [(s, why) for s, why in drafts(kernel) if why.startswith("rows side by side")]
    assert tuple(s.splits for s, _ in walked) == splits
    for schedule, why in walked:
        blocks = -(-kernel.row_count // schedule.block_rows)
        assert (schedule.splits == 1) == (blocks >= 2 * 132), why
        assert (schedule.splits > 1) == ("to fill the GPU" in why), why
    tall = [s for s, why in walked if ", tall:" in why]
    assert [(s.block_rows, s.block_columns) for s in tall] == [(32, 256)] * (len(splits) == 3)


@pytest.mark.parametrize(("body", "shape", "inputs", "params", "warps"), [
    ("F.layer_norm(x, (2048,), w, b)", (6, 2048),
     "torch.randn(6, 2048), torch.randn(2048), torch.randn(2048)", "x, w, b", 4),
    ("torch.softmax(x, dim=-1)", (5, 3000), "torch.randn(5, 3000)", "x", 8),
])
def test_long_rows_held_whole_are_drafted_four_programs_an_sm_pipelined(
        tmp_path, body, shape, inputs, params, warps):
    problem = one_input_problem(tmp_path, body, inputs, params)
    graph = load_site_graph(problem)
    resident = [(s, why) for s, why in drafts(main_kernel(program_of(graph)))
                if s.resident_per_sm]
    assert [(s.resident_per_sm, s.num_warps, s.block_rows) for s, _ in resident] == \
        [(4, warps, 1)], resident
    source = write_compiled(graph, resident[0][0])
    assert "in tl.range(PASSES, num_stages=2):" in source, source
    assert f"[(min({shape[0]}, 4 * sms), 1)]" in source
    actual, expected = run_beside_problem(source, problem, seed=3)
    assert_matches(actual, expected, source)


def test_rows_of_a_thousand_or_fewer_get_no_programs_per_sm_draft(tmp_path):
    graph = load_site_graph(one_input_problem(tmp_path, "torch.softmax(x, dim=-1)",
                                              "torch.randn(8, 1024)"))
    assert all(not s.resident_per_sm for s, _ in drafts(main_kernel(program_of(graph))))
