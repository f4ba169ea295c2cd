"""The CUDA tier's vectors of consecutive columns (`Schedule.vector`): in a row's walks a lane takes
2 or 4 consecutive columns a step, and an fp32 input or output lying along them is read or
written as one 8- or 16-byte access, kept on chip as one too. Correctness under these schedules,
on the CPU's stand-in and on a GPU, is `test_compiler_cuda`'s (`VECTORED`, `VECTOR_CASES`)."""

from __future__ import annotations

import re

import pytest
import torch

from generators.compiler.index import Expr, Ranges, linearize, unit_stride, unravel
from generators.compiler.schedule import Schedule, cuda_drafts
from generators.compiler.site import program_of
from generators.cuda.expressions import HELPERS
from generators.cuda.folds import FOLDS, VECTORS
from generators.cuda.program import write_cuda_compiled
from generators.mutations import neighbours
from generators.rules import RulesGenerator
from generators.site_graph import Unsupported, load_site_graph
from generators.triton.program import write_compiled
from tests.cuda_on_cpu import KernelFault, kernels_on_cpu
from tests.cuda_on_cpu import load_kernel as load_kernel_on_cpu
from tests.kernel_checks import assert_matches, one_input_problem

GROUP_NORM = ("F.group_norm(x, 2, w, b)",
              "torch.randn(2, 8, 3, 8), torch.randn(8), torch.randn(8)", "x, w, b")
KEPT_IN_VECTORS = Schedule(1, 8, 4, keep_row=True, vector=4)


def _graph(folder, body: str, inputs: str, params: str = "x"):
    return load_site_graph(one_input_problem(folder, body, inputs, params))


def _module(source: str):
    namespace: dict = {}
    exec(compile(source, "model_new.py", "exec"), namespace)
    return namespace["ModelNew"]()


def _group_offset(width_w: int, row_stride: int | None = None) -> tuple[Expr, Ranges]:
    """Where a group norm's input element lies, from its groups' domain (n, g, k): the input
    (2, 8, 3, W) viewed as 2 groups of 4 channels, its rows `row_stride` apart (W unless
    given: contiguous)."""
    ranges = Ranges({"n": 2, "g": 2, "k": 4 * 3 * width_w})
    coords = unravel(linearize([Expr.of("n"), Expr.of("g"), Expr.of("k")],
                               (2, 2, 4 * 3 * width_w)), (2, 8, 3, width_w), ranges)
    row = row_stride or width_w
    offset = Expr()
    for coord, stride in zip(coords, (8 * 3 * row, 3 * row, row, 1), strict=True):
        offset = offset + coord.scale(stride)
    return offset, ranges


def test_a_vector_lies_along_an_input_only_where_its_columns_are_consecutive_and_aligned():
    offset, ranges = _group_offset(8)
    assert unit_stride(offset, "k", 4, ranges) and unit_stride(offset, "k", 2, ranges)
    # Contiguous rows of 6: a group's 72 values lie one after the other, vectors of 4 too.
    offset, ranges = _group_offset(6)
    assert unit_stride(offset, "k", 4, ranges) and unit_stride(offset, "k", 2, ranges)
    # Rows of 6 values 8 apart: a vector of 4 would span two of them; one of 2 does not.
    offset, ranges = _group_offset(6, row_stride=8)
    assert not unit_stride(offset, "k", 4, ranges) and unit_stride(offset, "k", 2, ranges)
    # A weight per channel: the same value over a vector's columns, not consecutive ones.
    ranges = Ranges({"g": 2, "k": 96})
    channel = Expr.of("g").scale(4) + unravel(Expr.of("k"), (4, 3, 8), ranges)[0]
    assert not unit_stride(channel, "k", 4, ranges)
    # Rows 42 values apart: a vector of 4 would start off its alignment on odd rows.
    ranges = Ranges({"r": 6, "c": 40})
    assert not unit_stride(Expr.of("r").scale(42) + "c", "c", 4, ranges)
    assert unit_stride(Expr.of("r").scale(42) + "c", "c", 2, ranges)
    # Columns 3 apart (a transposed input): no run at all.
    assert not unit_stride(Expr.of("r") + Expr.of("c").scale(3), "c", 2, ranges)


def test_a_kept_walk_loads_stores_and_keeps_whole_vectors(tmp_path):
    source = write_cuda_compiled(_graph(tmp_path, *GROUP_NORM), KEPT_IN_VECTORS)
    kernel = source.split("__global__")[1]
    # The input read once from memory as vectors of 4, kept as such, read back as such by the
    # second walk; the output stored as vectors; the weights, per channel, a column at a time.
    assert len(re.findall(r"load_vector<float4>\(&in0\[", kernel)) == 1
    assert len(re.findall(r"store_vector\(&kept\[", kernel)) == 1
    assert len(re.findall(r"load_vector<float4>\(&kept\[", kernel)) == 1
    assert len(re.findall(r"store_vector\(&out0\[", kernel)) == 1
    assert re.search(r"= in1\[", kernel) and re.search(r"= in2\[", kernel)
    assert "for (int v" in kernel and "lane_of(" in kernel and "set_lane(" in kernel
    assert source.index(HELPERS + FOLDS + VECTORS) >= 0
    # The forward checks the one input loaded as vectors is aligned to them.
    assert "assert in0.data_ptr() % 16 == 0" in source
    assert "in1.data_ptr()" not in source and "in2.data_ptr()" not in source


def test_an_input_off_the_vectors_alignment_is_refused_by_the_forward(tmp_path):
    source = write_cuda_compiled(_graph(tmp_path, *GROUP_NORM), KEPT_IN_VECTORS)
    # The same shape and strides, 4 bytes past an aligned address.
    x = torch.randn(2 * 8 * 3 * 8 + 1)[1:].view(2, 8, 3, 8)
    w, b = torch.randn(8), torch.randn(8)
    with kernels_on_cpu():
        model = _module(source)
        with pytest.raises(AssertionError, match="multiple of 16 bytes"):
            model(x, w, b)
        assert_matches(model(x.clone(), w, b), torch.nn.functional.group_norm(x, 2, w, b))


def test_the_cpu_stand_in_traps_a_misaligned_vector_load():
    source = HELPERS + FOLDS + VECTORS + """
__global__ void shifted(const float* __restrict__ in0, float* __restrict__ out0) {
    const float4 q = load_vector<float4>(&in0[1 + 4 * threadIdx.x]);
    out0[threadIdx.x] = q.x;
}
"""
    kernel = load_kernel_on_cpu(source, "shifted", "PP")
    x, out = torch.randn(64), torch.empty(8)
    with pytest.raises(KernelFault, match="trapped on line"):
        kernel(grid=(1, 1, 1), block=(8, 1, 1), args=(x, out))


def test_vectors_are_dropped_where_they_would_span_a_run_or_rows_lie_side_by_side(tmp_path):
    odd = write_cuda_compiled(_graph(tmp_path / "odd", "F.layer_norm(x, (3, 5, 7))",
                                     "torch.randn(4, 3, 5, 7)"), KEPT_IN_VECTORS)
    assert "load_vector" not in odd and "columns a thread at a time" not in odd
    assert odd == write_cuda_compiled(_graph(tmp_path / "odd2", "F.layer_norm(x, (3, 5, 7))",
                                             "torch.randn(4, 3, 5, 7)"),
                                      Schedule(1, 8, 4, keep_row=True))
    leading = write_cuda_compiled(_graph(tmp_path / "leading", "torch.sum(x, dim=0)",
                                         "torch.randn(70, 300)"), Schedule(64, 32, 4, vector=4))
    assert "load_vector" not in leading and "ROWS" in leading


def test_the_triton_tier_declines_a_vector_width_with_the_reason(tmp_path):
    graph = _graph(tmp_path, "torch.softmax(x, dim=-1)", "torch.randn(6, 40)")
    with pytest.raises(Unsupported, match="vector width is the CUDA tier's"):
        write_compiled(graph, Schedule(1, 64, 4, vector=4))


def test_the_cuda_drafts_walk_vectors_of_four_and_the_search_narrows_them(tmp_path):
    graph = _graph(tmp_path, "torch.softmax(x, dim=-1)", "torch.randn(8, 32768)")
    program = program_of(graph)
    kernel = max(program.steps, key=lambda s: s.kernel.row_count * s.kernel.column_count).kernel
    drafts = cuda_drafts(kernel)
    assert drafts and all(s.vector == 4 for s, _ in drafts)
    assert all("4 columns a thread at a time, loaded as one vector" in why for _, why in drafts)
    narrower = [step for step in neighbours(drafts[0][0]) if step.knob == "vector"]
    assert [step.settings.vector for step in narrower] == [2]


def test_a_reductions_own_loop_walks_vectors_where_its_input_lies_along_it(tmp_path):
    # A sum over the last dimension: no column walk, the reduction's loop takes the vectors;
    # the boolean mask beside it is read a column at a time.
    source = write_cuda_compiled(_graph(tmp_path, "torch.where(m, x, 0.0).sum(-1)",
                                        "torch.randn(9, 32), torch.rand(9, 32) > 0.3", "x, m"),
                                 Schedule(2, 16, 4, vector=4))
    kernel = source.split("__global__")[1]
    assert len(re.findall(r"load_vector<float4>\(&in0\[", kernel)) == 1
    assert "load_vector" not in kernel.replace("load_vector<float4>(&in0[", "")
    assert "assert in0.data_ptr() % 16 == 0" in source and "in1.data_ptr()" not in source


def test_the_cuda_tier_drafts_a_reduction_in_vectors_and_triton_a_column_at_a_time(tmp_path):
    problem = one_input_problem(tmp_path, "torch.sum(x, dim=-1)", "torch.randn(64, 4096)")
    generator = RulesGenerator()
    cuda = [c for c in generator.propose(problem, None, n=20, tiers=("cuda",)).children
            if c.settings["writer"] == "write_cuda_compiled"]
    triton = [c for c in generator.propose(problem, None, n=20).children
              if c.settings["writer"] == "write_compiled"]
    assert cuda and all(c.settings["vector"] == 4 for c in cuda)
    assert all("loaded as one vector" in c.rationale for c in cuda)
    assert triton and all(c.settings["vector"] == 1 for c in triton)
