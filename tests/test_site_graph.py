"""A site's graph read from its problem on meta tensors, its constants written back as Python,
and its own values refused where a constant is needed."""

from __future__ import annotations

import pytest

from generators.site_graph import Ref, Unsupported, constant_source, load_site_graph

# A site problem that notes where each draw of its inputs was made, in a file beside it.
NOTING = """
import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x):
        return {body}


def get_inputs():
    with open(__file__ + ".drawn", "a") as notes:
        notes.write(torch.empty(0).device.type + " ")
    return [torch.rand(3, 5)]


def get_init_inputs():
    return []
"""


def drawn_on(tmp_path, body: str) -> tuple[list[str], object]:
    """Where the problem's inputs were drawn while its graph was read, and the graph (or the
    reason it is unsupported)."""
    path = tmp_path / "problem.py"
    path.write_text(NOTING.format(body=body))
    try:
        graph = load_site_graph(path)
    except Unsupported as err:
        graph = err
    return (tmp_path / "problem.py.drawn").read_text().split(), graph


def test_a_sites_graph_is_read_on_meta_tensors(tmp_path):
    # A problem's inputs can be gigabytes: the graph and their layouts are all that is read.
    where, graph = drawn_on(tmp_path, "torch.relu(x) * 2")
    assert where == ["meta"]
    assert [i.shape for i in graph.inputs] == [(3, 5)]


def test_an_op_with_no_meta_kernel_is_read_on_real_inputs(tmp_path):
    where, graph = drawn_on(tmp_path, "torch.unique(x).sum() + x.sum()")
    assert where == ["meta", "cpu"]
    assert isinstance(graph, Unsupported) and "not one fusible site" in str(graph)


def test_a_constant_is_written_as_python():
    assert constant_source((1, (2, 3)), "a size") == "(1, (2, 3))"
    assert constant_source("same", "a padding") == "'same'"


@pytest.mark.parametrize("value", [Ref(0, False), (1, (Ref(2, True), 3))],
                         ids=["a value", "a value nested in a tuple"])
def test_a_site_value_is_unsupported(value):
    with pytest.raises(Unsupported, match="a size that is a tensor"):
        constant_source(value, "a size that is a tensor")
