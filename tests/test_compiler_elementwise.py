"""Compiled elementwise sites: random chains, broadcasts, strides and dtypes."""

from __future__ import annotations

import random

import pytest
import torch

from core.evaluate import EvalConfig, evaluate
from generators.compiler.launches import main_kernel
from generators.compiler.schedule import Schedule, drafts, row_tile_width
from generators.compiler.site import program_of
from generators.site_graph import load_site_graph
from generators.triton.program import write_compiled
from tests.kernel_checks import assert_matches
from tests.test_site_problems import import_problem

UNARY = ["torch.relu({})", "torch.sigmoid({})", "torch.tanh({})", "torch.nn.functional.gelu({})",
         "torch.nn.functional.gelu({}, approximate='tanh')", "torch.nn.functional.silu({})",
         "torch.exp({} * 0.1)", "torch.abs({})", "({} * {} * 0.5)", "torch.clamp({}, -0.5, 0.7)",
         "torch.nn.functional.leaky_relu({}, 0.2)", "torch.nn.functional.hardswish({})"]
BINARY = ["({} + {})", "({} - {})", "({} * {})", "torch.maximum({}, {})", "({} / (1.5 + {}.abs()))"]


def random_problem(rng: random.Random, dtype: torch.dtype) -> str:
    rank = rng.randint(1, 4)
    shape = [rng.choice([1, 3, 5, 7, 13, 33]) for _ in range(rank)]
    inputs = [shape]
    for _ in range(rng.randint(0, 2)):
        # Broadcast partners: trailing dimensions, some of them 1.
        keep = rng.randint(1, rank)
        inputs.append([s if rng.random() < 0.6 else 1 for s in shape[rank - keep:]])
    partners = [f"in{i}" for i in range(1, len(inputs))]
    current, lines = "in0", []
    for i in range(rng.randint(1, 6)):
        # Each step consumes the chain so far: one connected site, no dead code.
        if partners and rng.random() < 0.5:
            pair = [current, partners.pop(0)]
            rng.shuffle(pair)
            expression = rng.choice(BINARY).format(*pair)
        else:
            expression = rng.choice(UNARY).replace("{}", current)
        lines.append(f"        v{i} = {expression}")
        current = f"v{i}"
    lines += [f"        {current} = {current} + {p}" for p in partners]
    draws = ", ".join(f"torch.randn({s}).to({dtype})" for s in inputs)
    return (
        "import torch\nimport torch.nn as nn\n\n\nclass Model(nn.Module):\n"
        f"    def forward(self, {', '.join(f'in{i}' for i in range(len(inputs)))}):\n"
        + "\n".join(lines)
        + f"\n        return {current}\n\n\ndef get_inputs():\n    return [{draws}]\n\n\n"
        "def get_init_inputs():\n    return []\n"
    )


def check(problem_path, write, inputs=None) -> None:
    """Write a candidate with `write(graph)`, run it and the problem, compare every output."""
    source = write(load_site_graph(problem_path))
    namespace: dict = {}
    exec(compile(source, "model_new.py", "exec"), namespace)
    problem = import_problem(problem_path)
    torch.manual_seed(7)
    inputs = inputs or problem.get_inputs()
    with torch.no_grad():
        expected = problem.Model()(*inputs)
        actual = namespace["ModelNew"]()(*inputs)
    pairs = zip(actual, expected, strict=True) if isinstance(expected, tuple) else [
        (actual, expected)]
    for out, ref in pairs:
        assert_matches(out, ref, problem_path.read_text())


def pointwise(block: int, rows: int = 4):
    return lambda graph: write_compiled(graph, Schedule(rows, block, 4))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("seed", range(6))
def test_random_chains_match_pytorch(seed, dtype, tmp_path):
    rng = random.Random(seed * 31 + len(str(dtype)))
    path = tmp_path / "problem.py"
    path.write_text(random_problem(rng, dtype))
    check(path, pointwise(rng.choice([32, 64, 128])))


def layout_problem(params: str, body: str, draws: list[str], dtype: torch.dtype) -> str:
    """`draws` are float32 expressions; a trailing `.t()` is applied after the dtype cast so
    the input stays transposed."""
    cast = [f"{d[:-4]}.to({dtype}).t()" if d.endswith(".t()") else f"{d}.to({dtype})"
            for d in draws]
    return ("import torch\nimport torch.nn as nn\n\n\nclass Model(nn.Module):\n"
            f"    def forward(self, {params}):\n        return {body}\n\n\n"
            f"def get_inputs():\n    return [{', '.join(cast)}]\n\n\n"
            "def get_init_inputs():\n    return []\n")


# Broadcast and stride patterns the rows × columns view must get right, at odd sizes.
LAYOUTS = {
    "row bias": ("x, b", "torch.nn.functional.gelu(x + b)",
                 ["torch.randn(7, 45)", "torch.randn(45)"]),
    "column scale": ("x, s", "torch.sigmoid(x) * s", ["torch.randn(9, 33)", "torch.randn(9, 1)"]),
    "channel": ("x, c", "torch.relu(x * c + x)",
                ["torch.randn(2, 5, 7, 3)", "torch.randn(1, 5, 1, 1)"]),
    "channel of a 3-d tensor": ("x, c", "x - c", ["torch.randn(3, 6, 11)", "torch.randn(6, 1)"]),
    "scalar-like": ("x, s", "torch.tanh(x - s)", ["torch.randn(13, 11)", "torch.randn(1, 1)"]),
    "transposed": ("x, y", "torch.relu(x) * y", ["torch.randn(37, 6).t()", "torch.randn(6, 37)"]),
    "transposed with a row bias": ("x, b", "torch.nn.functional.silu(x) + b",
                                   ["torch.randn(29, 5).t()", "torch.randn(29)"]),
    "outer product": ("a, b", "a * b", ["torch.randn(17, 1)", "torch.randn(1, 23)"]),
}
DTYPES = [torch.float32, torch.float16, torch.bfloat16]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_broadcast_and_strided_layouts_are_accepted(layout, dtype, tmp_path):
    path = tmp_path / "problem.py"
    path.write_text(layout_problem(*LAYOUTS[layout], dtype))
    source = write_compiled(load_site_graph(path), Schedule(4, 64, 4))
    verdict = evaluate(path, source, EvalConfig(device="cpu", time=False))
    assert verdict.correct, f"{layout} ({dtype}): {verdict.reason}\n{source}"


def test_transposed_inputs_stay_transposed_in_the_problems(tmp_path):
    path = tmp_path / "problem.py"
    path.write_text(layout_problem(*LAYOUTS["transposed"], torch.bfloat16))
    x, y = import_problem(path).get_inputs()
    assert not x.is_contiguous() and x.dtype == torch.bfloat16 and y.is_contiguous()


def test_a_kernel_takes_only_the_layout_it_was_written_for(tmp_path):
    path = tmp_path / "problem.py"
    path.write_text(layout_problem(*LAYOUTS["transposed"], torch.float32))
    with pytest.raises(AssertionError, match="written for in0 of shape"):
        check(path, pointwise(16), inputs=[torch.randn(9, 5), torch.randn(9, 5)])


def kernel_of(path):
    return main_kernel(program_of(load_site_graph(path)))


ROWS = {
    # Per-channel values: a row a (sample, channel), its 7 × 9 columns.
    "channel": ("x, c", "torch.relu(x * c + x)",
                ["torch.randn(2, 5, 7, 9)", "torch.randn(1, 5, 1, 1)"], (0, 1)),
    "channel of a 3-d tensor": ("x, c", "x - c", ["torch.randn(3, 6, 40)", "torch.randn(6, 1)"],
                                (0, 1)),
    "column scale": ("x, s", "torch.sigmoid(x) * s", ["torch.randn(9, 33)", "torch.randn(9, 1)"],
                     (0,)),
    # Rows of fewer columns than a warp: one flat walk.
    "short channel rows": LAYOUTS["channel"] + ((),),
    # A bias over the last dimension, an outer product, a scalar: one flat walk.
    "row bias": LAYOUTS["row bias"] + ((),),
    "outer product": LAYOUTS["outer product"] + ((),),
    "scalar-like": LAYOUTS["scalar-like"] + ((),),
}


@pytest.mark.parametrize("name", list(ROWS))
def test_broadcast_inputs_make_the_rows_they_vary_along(name, tmp_path):
    *problem, rows = ROWS[name]
    path = tmp_path / "problem.py"
    path.write_text(layout_problem(*problem, torch.float32))
    assert kernel_of(path).rows == rows
    check(path, pointwise(32))


def test_the_rows_of_a_broadcast_input_load_it_once_a_row(tmp_path):
    path = tmp_path / "problem.py"
    path.write_text(layout_problem(*ROWS["channel"][:3], torch.float32))
    source = write_compiled(load_site_graph(path), Schedule(4, 32, 4))
    channel_load = next(line for line in source.splitlines() if "tl.load(in1" in line)
    assert "cols" not in channel_load and "mask=rmask" in channel_load, source


def test_rows_that_are_not_innermost_in_memory_stay_one_flat_walk(tmp_path):
    path = tmp_path / "problem.py"
    path.write_text(layout_problem("x, c", "x * c", ["torch.randn(5, 37).t()",
                                                     "torch.randn(37, 1)"], torch.float32))
    assert kernel_of(path).rows == ()
    check(path, pointwise(32))


@pytest.mark.parametrize("columns,tile,width", [
    (8192, 1024, 1024),  # long rows: a part of a row a program
    (3136, 1024, 256),  # 56×56 maps: 256 wide pads a row by 6 %, 1024 would by 31 %
    (49, 1024, 64),  # 7×7 maps: every power of two pads 15, keep the row's own
    (3, 1024, 4),  # narrow rows: most of the tile in rows
    (196, 4096, 256),  # 14×14 maps: no width pads by an eighth or less
])
def test_row_tiles_pad_a_row_by_little(columns, tile, width):
    assert row_tile_width(columns, tile) == width


def test_drafts_over_channel_rows_fill_their_tiles(tmp_path):
    path = tmp_path / "problem.py"
    path.write_text(layout_problem("x, c", "torch.relu(x * c)", ["torch.randn(2, 5, 56, 56)",
                                                                "torch.randn(1, 5, 1, 1)"],
                                   torch.float32))
    schedules = [schedule for schedule, _ in drafts(kernel_of(path))]
    assert [(s.block_rows, s.block_columns, s.num_warps) for s in schedules] == [
        (4, 256, 4), (16, 256, 8)]


def test_inference_batch_norm_broadcasts_along_channels(tmp_path):
    path = tmp_path / "problem.py"
    path.write_text(
        "import torch\nimport torch.nn as nn\n\n\nclass Model(nn.Module):\n"
        "    def forward(self, x, mean, var, w, b):\n"
        "        y = torch.nn.functional.batch_norm(x, mean, var, w, b, False, 0.1, 1e-5)\n"
        "        return torch.relu(y)\n\n\n"
        "def get_inputs():\n    return [torch.randn(2, 3, 4, 5), torch.randn(3), "
        "torch.rand(3) + 0.5, torch.randn(3), torch.randn(3)]\n\n\n"
        "def get_init_inputs():\n    return []\n")
    check(path, pointwise(32))
