"""The layout the vendor library's convolution takes its input in, a schedule setting: as the
site's input is laid out, or channels-last, with the kernels after it reading its channels-last
output (`generators.compiler.library`)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import torch

from core.evaluate.static_rules import check_candidate
from generators.compiler.schedule import Schedule
from generators.compiler.site import program_of
from generators.mutations import diagnosed_neighbours
from generators.site_graph import Unsupported, load_site_graph
from generators.triton.program import compiled_drafts, write_compiled
from tests.kernel_checks import assert_matches, run_beside_problem
from tests.test_generator_conv import BN, write_problem

CHANNELS_LAST = "channels_last"


def checked_drafts(path: Path, count: int) -> list[tuple[Schedule, str]]:
    """The site's first `count` drafts, each checked against the problem under the interpreter."""
    graph = load_site_graph(path)
    found = compiled_drafts(graph)[:count]
    for schedule, _ in found:
        actual, expected = run_beside_problem(write_compiled(graph, schedule), path, 5)
        assert_matches(actual, expected, path.read_text())
    return found


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_conv_epilogue_reads_the_channels_last_output_in_tiles_of_rows(dtype, tmp_path):
    path = write_problem(tmp_path / "problem.py", "torch.nn.functional.conv2d(x, w, cb, 1, 1)",
                         [BN, "torch.relu(v)"],
                         {"x": "2, 3, 7, 9", "w": "40, 3, 3, 3", "cb": "40", "mean": "40",
                          "var": "40", "g": "40", "b": "40"}, dtype)
    drafts = checked_drafts(path, 2)
    # Each draft on the input as given, then its twin channels-last.
    assert [s.library_layout for s, _ in drafts] == ["", CHANNELS_LAST]
    laid, why = drafts[1]
    assert (laid.block_rows, laid.block_columns) == (32, 64) and "rows side by side" in why
    source = write_compiled(load_site_graph(path), laid)
    assert ("torch.nn.functional.conv2d(in0.contiguous(memory_format=torch.channels_last), in1, "
            "None, [1, 1], [1, 1], [1, 1], 1)") in source
    # The kernels were written for the convolution's output as cuDNN lays it out.
    assert "in7.stride() == (2520, 1, 360, 40)" in source
    assert "on channels-last input" in source.splitlines()[0]


def test_a_volume_norm_and_an_instance_norm_read_a_channels_last_output(tmp_path):
    volume = write_problem(tmp_path / "volume.py", "torch.nn.functional.conv3d(x, w, cb, 1, 1)",
                           ["torch.nn.functional.group_norm(v, 2)", "torch.relu(v)"],
                           {"x": "2, 3, 4, 5, 6", "w": "4, 3, 3, 3, 3", "cb": "4"},
                           torch.float32)
    _, (laid, _) = checked_drafts(volume, 2)
    assert laid.library_layout == CHANNELS_LAST
    source = write_compiled(load_site_graph(volume), laid)
    assert "memory_format=torch.channels_last_3d" in source
    # The judge's static rules let a candidate name the layout.
    assert check_candidate(source, volume.read_text(), tf32=True).violations == []
    norm = write_problem(tmp_path / "norm.py", "torch.nn.functional.conv2d(x, w, cb)",
                         ["torch.nn.functional.instance_norm(v)", "v / 2.0"],
                         {"x": "2, 3, 9, 10", "w": "6, 3, 3, 3", "cb": "6"}, torch.float32)
    _, (laid, why) = checked_drafts(norm, 2)
    # Each (sample, channel) row lies beside the next in the channels-last output.
    assert laid.library_layout == CHANNELS_LAST and "rows side by side" in why


def test_a_site_without_a_library_call_takes_no_library_layout(tmp_path):
    path = tmp_path / "problem.py"
    path.write_text("import torch\nimport torch.nn as nn\n\n\nclass Model(nn.Module):\n"
                    "    def forward(self, x):\n        return torch.relu(x) * 2\n\n\n"
                    "def get_inputs():\n    return [torch.randn(4, 64)]\n\n\n"
                    "def get_init_inputs():\n    return []\n")
    graph = load_site_graph(path)
    assert all(not s.library_layout for s, _ in compiled_drafts(graph))
    with pytest.raises(Unsupported, match="a convolution by 'channels_last', in a site that "
                                          "makes none"):
        program_of(graph, CHANNELS_LAST)
    with pytest.raises(Unsupported, match="a convolution by 'nhwc'"):
        write_compiled(graph, Schedule(library_layout="nhwc"))


def test_a_child_may_move_the_convolution_back_to_its_input_as_given():
    laid = Schedule(32, 64, 4, library_layout=CHANNELS_LAST)
    steps = {step.settings.library_layout: step.rationale
             for step in diagnosed_neighbours(laid, "")
             if step.settings == replace(laid, library_layout=step.settings.library_layout)}
    assert "" in steps and "as given" in steps[""]
