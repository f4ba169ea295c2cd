"""Offsets written on a walk's flat counter: where a tensor lies along a contiguous run of the
dimensions a walk covers, its offset is linear in the walk's flat counter and is written on that
counter, so the kernel computes no coordinate it does not need; and a walk whose blocks' shares
fill the row in whole passes carries no bounds check. Correctness under every schedule is the
compiler cases' (`test_compiler_cuda`, `test_compiler_kernels`)."""

from __future__ import annotations

import re

import torch

from generators.compiler.emit import ValueEmitter
from generators.compiler.index import Expr, Ranges, floordiv, mod
from generators.compiler.schedule import Schedule
from generators.compiler.site import program_of
from generators.cuda.program import write_cuda_compiled
from generators.site_graph import load_site_graph
from generators.triton.program import write_compiled
from tests.cuda_on_cpu import kernels_on_cpu
from tests.kernel_checks import assert_matches, one_input_problem

INSTANCE_NORM = "torch.nn.functional.instance_norm(x)"
KEPT_CLUSTER = Schedule(1, 128, 1, cluster_blocks=4, keep_row=True, vector=4)


def _graph(folder, body: str, inputs: str, params: str = "x"):
    return load_site_graph(one_input_problem(folder, body, inputs, params))


def _kernel(source: str) -> str:
    """The source's first kernel, to the end of its CUDA text."""
    return source.split("__global__")[1].split('"""')[0]


def _emitter(tmp_path) -> ValueEmitter:
    graph = _graph(tmp_path, INSTANCE_NORM, "torch.randn(2, 3, 8, 16)")
    emitter = ValueEmitter(program_of(graph).steps[0].kernel)
    emitter.divide = "/"
    emitter.statement = lambda target, text, kind: f"const int {target} = {text};"
    emitter.sizes.update(h=8, w=16, g=2, k=64)
    return emitter


def test_an_offset_linear_in_the_flat_counter_is_written_on_it(tmp_path):
    emitter = _emitter(tmp_path)
    emitter.counters("col", ["h", "w"])
    # The counters are bound, and kept for whatever needs a coordinate alone.
    assert emitter.render(Expr.of("h")) == emitter.bound["h"]
    assert emitter.lines[-2].endswith("= col / 16;") and emitter.lines[-1].endswith(
        "= (col) % 16;")
    # Row-major over (h, w): the walk's own counter, with no division.
    assert emitter.render(Expr.of("h").scale(16) + "w") == "col"
    assert emitter.render(Expr.of("h").scale(16) + "w" + 48) == "col + 48"
    # Transposed, the offset is not linear in it: written on the coordinates.
    transposed = emitter.render(Expr.of("w").scale(8) + "h")
    assert transposed == f"{emitter.bound['h']} + {emitter.bound['w']} * 8"


def test_counters_of_several_walks_each_render_on_their_own_flat_counter(tmp_path):
    emitter = _emitter(tmp_path)
    emitter.counters("first", ["h", "w"])
    at_first = dict(emitter.bound)
    emitter.counters("second", ["h", "w"])
    offset = Expr.of("h").scale(16) + "w"
    assert emitter.render(offset) == "second"
    assert emitter.render(offset, at_first) == "first"


def test_an_instance_norm_walks_its_rows_without_dividing(tmp_path):
    graph = _graph(tmp_path, INSTANCE_NORM, "torch.randn(2, 3, 8, 16)")
    kernel = _kernel(write_cuda_compiled(graph, KEPT_CLUSTER))
    loads = re.findall(r"load_vector<float4>\(&in0\[([^\]]*)\]", kernel)
    stores = re.findall(r"store_vector\(&out0\[([^\]]*)\]", kernel)
    assert loads and stores
    for offset in loads + stores:
        assert "/" not in offset and "%" not in offset, offset
    assert " % 16" not in kernel and " / 16" not in kernel
    triton = write_compiled(graph, Schedule(1, 64, 2))
    loads = re.findall(r"tl\.load\(in0 \+ ([^,]*),", triton)
    assert loads and all("//" not in o and "%" not in o for o in loads), loads
    # The coordinates no offset takes are not computed at all.
    assert "//" not in triton.split("@triton.jit")[1].split('"""')[0], triton


def test_a_channel_weight_keeps_its_division(tmp_path):
    graph = _graph(tmp_path, "F.group_norm(x, 2, w, b)",
                   "torch.randn(2, 8, 3, 8), torch.randn(8), torch.randn(8)", "x, w, b")
    kernel = _kernel(write_cuda_compiled(graph, Schedule(1, 8, 4, keep_row=True, vector=4)))
    weight = re.search(r"= in1\[([^\]]*)\]", kernel)
    assert weight and "/ 24" in kernel, kernel


def test_a_walk_filling_its_row_in_whole_passes_has_no_bounds_check(tmp_path):
    # Rows of 512 over 4 blocks of 32 lanes of 4 columns: every lane of every pass is in range.
    filled = _kernel(write_cuda_compiled(
        _graph(tmp_path / "filled", INSTANCE_NORM, "torch.randn(2, 3, 16, 32)"), KEPT_CLUSTER))
    assert "inside" not in filled and "row_ok && true" not in filled
    # Rows of 480: each block's share of 120 leaves its pass part empty, so the lanes check.
    ragged = _kernel(write_cuda_compiled(
        _graph(tmp_path / "ragged", INSTANCE_NORM, "torch.randn(2, 3, 16, 30)"), KEPT_CLUSTER))
    assert re.search(r"const bool inside\d+ = col\d+ < end\d+;", ragged)


def test_a_filled_walk_computes_what_pytorch_does(tmp_path):
    # Rows of 256 shared by 2 blocks of 32 lanes taking 4 columns: whole passes, no check.
    graph = _graph(tmp_path, "F.layer_norm(x, (4, 64)) * 2.0", "torch.randn(6, 4, 64)")
    source = write_cuda_compiled(graph, Schedule(1, 128, 1, splits=2, vector=4))
    assert "inside" not in _kernel(source)
    x = torch.randn(6, 4, 64)
    namespace: dict = {}
    with kernels_on_cpu():
        exec(compile(source, "model_new.py", "exec"), namespace)
        actual = namespace["ModelNew"]()(x)
    assert_matches(actual, torch.nn.functional.layer_norm(x, (4, 64)) * 2.0)


def test_two_dimensions_one_after_the_other_in_memory_merge_into_one_remainder():
    ranges = Ranges({"f": 32 * 56 * 56})
    h, w = mod(floordiv(Expr.of("f"), 56, ranges), 56, ranges), mod(Expr.of("f"), 56, ranges)
    assert h.scale(56) + w == Expr(((("%", Expr.of("f"), 3136), 1),))
    # Under 56², nothing is left to divide: the quotient of the outer dimension cancels it.
    small = Ranges({"f": 56 * 56})
    h, w = floordiv(Expr.of("f"), 56, small), mod(Expr.of("f"), 56, small)
    assert h.scale(56) + w == Expr.of("f")


def test_a_batch_norm_walk_divides_once_a_load(tmp_path):
    # A channel's values: 3 samples of 6 × 8 contiguous values, a sample's stride 4 × 48 apart.
    emitter = _emitter(tmp_path)
    emitter.sizes.update(n=3, h=6, w=8)
    emitter.bound["g"] = "row"
    emitter.counters("col", ["n", "h", "w"])
    offset = Expr.of("n").scale(4 * 48) + Expr.of("g").scale(48) + Expr.of("h").scale(8) + "w"
    text = emitter.render(offset)
    assert text.count("/") == 1 and text.count("%") == 1, text
    assert "(col) % 48" in text and "(col) / 48) * 192" in text, text
    graph = _graph(tmp_path / "site", "F.batch_norm(x, None, None, training=True)",
                   "torch.randn(3, 4, 6, 8)")
    for schedule in (KEPT_CLUSTER, Schedule(1, 64, 2, keep_row=True, vector=4)):
        source = write_cuda_compiled(graph, schedule)
        loads = re.findall(r"load_vector<float4>\(&in0\[([^\]]*)\]", _kernel(source))
        assert loads and all(o.count("/") == 1 and o.count("%") == 1 for o in loads), loads
    # The CPU's stand-in runs no clusters: the block that keeps its row alone is run.
    x = torch.randn(3, 4, 6, 8) * 3.0 + 5.0
    namespace: dict = {}
    with kernels_on_cpu():
        exec(compile(source, "model_new.py", "exec"), namespace)
        actual = namespace["ModelNew"]()(x)
    assert_matches(actual, torch.nn.functional.batch_norm(x, None, None, training=True))
