"""Cutting graphs into sites: families, fusion boundaries, identity, convexity, mutation."""

from __future__ import annotations

import torch
import torch.fx as fx
import torch.nn as nn
import torch.nn.functional as F

from core.profile.roofline import GpuPeaks
from core.profile.sites import find_sites
from core.runtime.capture import capture
from core.runtime.ops import function_name, op_info
from core.runtime.partition import partition
from core.runtime.segments import segments
from tests import models

CPU = torch.device("cpu")


def sites_of(model: nn.Module, *inputs: torch.Tensor):
    return find_sites(capture(model.eval(), inputs, CPU), GpuPeaks())


def ops_by_family(table) -> set[tuple[str, tuple[str, ...]]]:
    return {(s.family, s.problem.ops) for s in table.sites}


def test_mlp_block_cuts_into_two_matmuls_the_second_finishing_the_norm():
    model, inputs = models.make_mlp()
    assert ops_by_family(sites_of(model, *inputs)) == {
        ("matmul", ("linear", "gelu")),
        ("matmul", ("linear", "add", "layer_norm")),
    }


def test_conv_takes_inference_batch_norm_activation_and_residual():
    model, inputs = models.make_resnet()
    found = ops_by_family(sites_of(model, *inputs))
    assert ("conv", ("conv2d", "batch_norm", "relu")) in found
    assert ("conv", ("conv2d", "batch_norm", "add", "relu")) in found
    # The last block's conv takes the global pooling too: its full-size output is never written.
    assert ("conv", ("conv2d", "batch_norm", "add", "relu", "adaptive_avg_pool2d")) in found


def test_identical_blocks_are_one_site_with_many_calls():
    model, inputs = models.make_stacked_mlp()
    table = sites_of(model, *inputs)
    assert len(table.sites) == 2
    assert all(site.calls == 3 for site in table.sites)
    assert all(len(site.call_sites) == 3 for site in table.sites)


def test_graph_breaks_become_more_graphs_and_loops_count_calls():
    model, inputs = models.make_data_dependent()
    captured = capture(model, inputs, CPU)
    assert len(captured.graphs) >= 2
    table = find_sites(captured, GpuPeaks())
    looped = next(s for s in table.sites if s.problem.ops == ("linear", "sigmoid", "mul"))
    assert looped.calls == 2


def test_reduction_swallows_its_prologue_of_the_same_shape():
    class Model(nn.Module):
        def forward(self, x, y):
            private = F.softmax(torch.exp(x) * 2, dim=-1)
            shared = x + y  # read again below: fused, with its reader as the epilogue
            return private, F.layer_norm(shared, (8,)), shared * 3

    table = sites_of(Model(), torch.randn(4, 8), torch.randn(4, 8))
    assert ops_by_family(table) == {
        ("reduction", ("exp", "mul", "softmax")),
        ("reduction", ("add", "layer_norm", "mul")),
    }
    norm = next(s for s in table.sites if "layer_norm" in s.problem.ops)
    assert len(norm.call_sites[0].region.outputs) == 2  # the norm and shared * 3


def test_prologue_with_a_smaller_shape_stays_its_own_site():
    class Model(nn.Module):
        def forward(self, x, bias):
            return F.layer_norm(x + bias * 0.5, (8,))  # bias * 0.5 is [8], not a row

    found = ops_by_family(sites_of(Model(), torch.randn(4, 8), torch.randn(8)))
    assert found == {("pointwise", ("mul", "add")), ("reduction", ("layer_norm",))}


def test_epilogue_never_makes_a_region_that_leaves_and_comes_back():
    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = nn.Linear(8, 8)

        def forward(self, x):
            y = self.proj(x)
            scale = y.amax(dim=-1, keepdim=True)  # reduction computed from the matmul
            return torch.relu(y) / scale  # needs both: must not join the matmul region

    model, x = Model(), torch.randn(4, 8)
    captured = capture(model, (x,), CPU)
    graph = captured.graphs[0]
    segs = segments(graph.module.graph, graph.regions)  # raises on a cycle
    assert sum(1 for s in segs if s.region is not None) == len(graph.regions)
    matmul = next(r for r in graph.regions if r.family == "matmul")
    assert [n for n in matmul.nodes if "div" in n.name or "truediv" in n.name] == []


def test_safe_inplace_ops_become_out_of_place_and_unsafe_ones_stay():
    class Model(nn.Module):
        def forward(self, x):
            y = (x * 2).relu_()  # a fresh intermediate nothing else reads: safe
            z = x * 3
            z.sigmoid_()  # `z` is read below through the pre-mutation value: not safe
            x.add_(1)  # mutates a graph input: stays as written
            return y + x + z

    captured = capture(Model(), (torch.randn(6),), CPU)
    graph = captured.graphs[0].module.graph
    methods = [n.target for n in graph.nodes if n.op == "call_method"]
    assert sorted(methods) == ["add_", "relu", "sigmoid_"]
    regions = partition(graph)
    in_regions = {n.target for r in regions for n in r.nodes}
    assert "relu" in in_regions and not in_regions & {"add_", "sigmoid_"}


def test_reshape_between_matmul_and_epilogue_stays_in_the_region():
    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.weight = nn.Parameter(torch.randn(16, 16))
            self.bias = nn.Parameter(torch.randn(16))

        def forward(self, x, residual):
            flat = torch.addmm(self.bias, x.view(-1, 16), self.weight)
            return flat.view(2, 4, 16) + residual

    found = ops_by_family(sites_of(Model(), torch.randn(2, 4, 16), torch.randn(2, 4, 16)))
    assert found == {("matmul", ("addmm", "view", "add"))}


def test_matmul_takes_one_reduction_of_its_rows_and_the_ops_on_the_reduced_rows():
    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = nn.Linear(16, 24)

        def forward(self, x):
            y = self.linear(x) / 2
            lse = torch.logsumexp(y, dim=1, keepdim=True)
            out = torch.sum(lse * 1.5, dim=1, keepdim=True)  # over a dimension of size one
            return F.mish(out), y - lse

    found = ops_by_family(sites_of(Model(), torch.randn(8, 16)))
    # `y - lse` spreads the rows' values back over the tile: the tiles are written by then.
    assert found == {("matmul", ("linear", "div", "logsumexp", "mul", "sum", "mish")),
                     ("pointwise", ("sub",))}


def test_reductions_a_matmul_tile_cannot_take_start_their_own_site():
    class Model(nn.Module):
        def forward(self, x, w):
            y = x @ w
            return torch.sum(y, dim=0), torch.softmax(y * 2, dim=1), torch.sum(y, dim=1).sum()

    table = sites_of(Model(), torch.randn(8, 16), torch.randn(16, 12))
    # The row sum and the softmax of rows a tile holds join the matmul; the column sum and
    # the sum of everything are sites of their own.
    assert sorted(s.problem.ops for s in table.sites) == [
        ("matmul", "mul", "softmax", "sum"), ("sum",), ("sum",)]


def test_matmul_takes_the_elementwise_chain_that_only_computes_its_left_operand():
    class Model(nn.Module):
        def forward(self, x, scale, w, b, y, v):
            fused = F.linear(F.gelu(x * scale + 1.0), w, b)
            shared = torch.relu(y)  # also returned: it stays a site of its own
            outer = x[:, :1] + scale  # no input of its shape: nothing for the kernel to walk
            return fused, shared @ v, shared, outer @ w.t()

    x, scale, w, b = torch.randn(8, 16), torch.randn(16), torch.randn(24, 16), torch.randn(24)
    found = ops_by_family(sites_of(Model(), x, scale, w, b, torch.randn(8, 16),
                                   torch.randn(16, 4)))
    assert ("matmul", ("mul", "add", "gelu", "linear")) in found
    assert ("pointwise", ("relu",)) in found and ("matmul", ("matmul",)) in found
    assert ("pointwise", ("add",)) in found


def test_a_conv_takes_a_norm_of_its_output_and_what_follows():
    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.up = nn.ConvTranspose2d(4, 8, 3)
            self.conv = nn.Conv2d(4, 8, 3)
            self.norm = nn.GroupNorm(2, 8)

        def forward(self, x):
            first = self.norm(F.gelu(self.up(x)))
            kept = torch.sigmoid(self.conv(x) + 1.0)  # also returned: a second output
            return first, torch.tanh(self.norm(kept)), kept * 2

    found = ops_by_family(sites_of(Model(), torch.randn(2, 4, 10, 10)))
    assert found == {("conv", ("conv_transpose2d", "gelu", "group_norm")),
                     ("conv", ("conv2d", "add", "sigmoid", "group_norm", "tanh", "mul"))}


def test_a_conv_takes_a_second_reduction_only_over_values_of_its_outputs_size():
    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(4, 8, 3)
            self.norm = nn.GroupNorm(2, 8)

        def forward(self, x):
            normed = torch.relu(self.norm(self.conv(x)))
            # Over the norm's output: joined, so that the output is never written whole.
            pooled = torch.logsumexp(normed, dim=1)
            # Over a reduced value (a min over the channels): a site of its own.
            low = self.conv(x * 2).min(dim=1)[0]
            return pooled, torch.softmax(low, dim=-1)

    found = ops_by_family(sites_of(Model(), torch.randn(2, 4, 10, 10)))
    assert ("conv", ("conv2d", "group_norm", "relu", "logsumexp")) in found
    assert ("reduction", ("softmax",)) in found
    assert not any(family == "reduction" and "logsumexp" in ops for family, ops in found)


def test_a_reduction_over_a_norms_output_joins_the_norm():
    class Model(nn.Module):
        def forward(self, x):
            normed = torch.relu(F.layer_norm(x, (16,)))
            # The tokens' mean of the normed values: in the norm's site, whose output is then
            # never written whole; the max of that mean is over a reduced value, a site apart.
            pooled = normed.mean(dim=1)
            return pooled, pooled.amax(dim=-1)

    found = ops_by_family(sites_of(Model(), torch.randn(2, 5, 16)))
    assert found == {("reduction", ("layer_norm", "relu", "mean")), ("reduction", ("amax",))}


def test_matmul_takes_a_norm_of_its_operands_rows_that_only_it_reads():
    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.norm, self.up = nn.LayerNorm(16), nn.Linear(16, 24)
            self.norm2, self.down = nn.LayerNorm(24), nn.Linear(24, 8)

        def forward(self, x):
            # Also returned: not the down projection's prologue, but finished by the up
            # projection's tiles.
            shared = self.norm2(self.up(self.norm(x)))
            return self.down(shared), shared

    found = ops_by_family(sites_of(Model(), torch.randn(2, 5, 16)))
    assert found == {("matmul", ("layer_norm", "linear", "layer_norm")),
                     ("matmul", ("linear",))}


def test_dangling_reshape_is_trimmed_from_the_region():
    class Model(nn.Module):
        def forward(self, x):
            return torch.relu(x).view(-1)

    found = ops_by_family(sites_of(Model(), torch.randn(3, 5)))
    assert found == {("pointwise", ("relu",))}


def test_floor_counts_bytes_once_and_matmul_flops():
    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = nn.Linear(64, 32, bias=False)

        def forward(self, x):
            return self.proj(x)

    table = sites_of(Model(), torch.randn(16, 64))
    (site,) = table.sites
    assert site.cost.bytes == 4 * (16 * 64 + 32 * 64 + 16 * 32)
    assert site.cost.matrix_flops == 2 * 16 * 32 * 64
    peaks = GpuPeaks()
    read, written = 4 * (16 * 64 + 32 * 64), 4 * 16 * 32
    expected = max(read / peaks.read_bandwidth + written / peaks.bandwidth,
                   site.cost.matrix_flops / peaks.matrix_flops["fp32"]) * 1e3
    assert abs(site.floor_ms - expected) < 1e-12


def test_no_region_spans_a_mutation_and_order_around_it_is_kept():
    class Model(nn.Module):
        def forward(self, x, y):
            a = x * 2
            y.add_(1)  # mutates an input: a barrier
            return a + y  # reads y after the write: must not join the region of `a`

    x, y = torch.randn(5), torch.randn(5)
    captured = capture(Model(), (x, y.clone()), CPU)
    graph = captured.graphs[0]
    assert [[op_info(n).name for n in r.nodes] for r in graph.regions] == [["mul"], ["add"]]
    order = [n for s in segments(graph.module.graph, graph.regions) for n in s.nodes]
    names = [n.name if n.op == "call_function" else n.target for n in order]
    assert names.index("add_") < names.index("add")


class DropsAResult(nn.Module):
    """Computes a mean it never returns (as blocks drop MultiheadAttention's averaged weights),
    and mutates a buffer through an in-place op whose result it does not read either."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("steps", torch.zeros(()))

    def forward(self, x):
        weights = torch.softmax(x, dim=-1)
        _unused = weights.mean(dim=0)
        self.steps.add_(1)
        return weights * 2


def test_values_nothing_uses_are_not_sites_but_mutations_stay():
    model, x = DropsAResult(), torch.randn(6, 10)
    captured = capture(model, (x,), CPU)
    ops = [op_info(n).name for g in captured.graphs for n in g.module.graph.nodes
           if n.op in ("call_function", "call_method")]
    assert "mean" not in ops, ops
    assert "add" in ops, ops  # the buffer's update, although nothing reads its result
    table = find_sites(captured, GpuPeaks())
    assert ("reduction", ("mean",)) not in ops_by_family(table)
    steps = model.steps.item()
    with torch.no_grad():
        out = captured.compiled(x)
    torch.testing.assert_close(out, torch.softmax(x, dim=-1) * 2)
    assert model.steps.item() == steps + 1


def _dynamo_graph(model: nn.Module, inputs: tuple) -> fx.Graph:
    graphs: list[fx.GraphModule] = []

    def keep(gm: fx.GraphModule, example_inputs: list) -> object:
        graphs.append(gm)
        return gm.forward

    torch._dynamo.reset()
    torch.compile(model, backend=keep)(*inputs)
    return graphs[0].graph


def test_operators_recorded_as_methods_cut_as_operators_do():
    """torch 2.11's Dynamo records `mask == 0` as `mask.__eq__(0)`: the same sites either way."""

    class Model(nn.Module):
        def forward(self, q, k, v, mask, x):
            w = (q @ k.transpose(-2, -1) * 0.25).masked_fill(mask == 0, float("-inf"))
            return w.softmax(-1) @ v, 1.0 - x.sigmoid()

    inputs = (torch.randn(2, 5, 8), torch.randn(2, 7, 8), torch.randn(2, 7, 8),
              (torch.rand(2, 5, 7) < 0.7).float(), torch.randn(6))
    written = {"eq": ("__eq__", False), "sub": ("__rsub__", True)}

    def cut(as_methods: bool) -> list[tuple[str, list[str]]]:
        graph = _dynamo_graph(Model(), inputs)
        for node in graph.nodes:
            name = function_name(node.target) if node.op == "call_function" else None
            if as_methods and name in written:
                method, swapped = written[name]
                node.op, node.target = "call_method", method
                node.args = tuple(reversed(node.args)) if swapped else node.args
        return [(r.family, [op_info(n).name for n in r.nodes]) for r in partition(graph)]

    as_operators = cut(False)
    assert [family for family, _ in as_operators] == ["attention", "pointwise"]
    assert cut(True) == as_operators
