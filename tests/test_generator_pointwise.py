"""Rules Triton for pointwise sites: random chains, broadcasts, strides and dtypes."""

from __future__ import annotations

import random

import pytest
import torch

from core.evaluate import EvalConfig, evaluate
from generators.site_graph import Unsupported, load_site_graph
from generators.triton.pointwise import PointwiseConfig, write_pointwise
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


def pointwise(block: int):
    return lambda graph: write_pointwise(graph, PointwiseConfig(block=block))


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
    source = write_pointwise(load_site_graph(path), PointwiseConfig(block=64))
    verdict = evaluate(path, source, EvalConfig(device="cpu", time=False))
    assert verdict.correct, f"{layout} ({dtype}): {verdict.reason}\n{source}"


def test_transposed_inputs_stay_transposed_in_the_problems(tmp_path):
    path = tmp_path / "problem.py"
    path.write_text(layout_problem(*LAYOUTS["transposed"], torch.bfloat16))
    x, y = import_problem(path).get_inputs()
    assert not x.is_contiguous() and x.dtype == torch.bfloat16 and y.is_contiguous()


def test_other_shapes_and_strides_than_the_captured(tmp_path):
    path = tmp_path / "problem.py"
    path.write_text(layout_problem(*LAYOUTS["transposed"], torch.float32))
    check(path, pointwise(16), inputs=[torch.randn(9, 5), torch.randn(9, 5)])
    check(path, pointwise(16), inputs=[torch.randn(9, 5), torch.randn(5, 9).t()])
    check(path, pointwise(128), inputs=[torch.randn(1, 300), torch.randn(300)])
    check(path, pointwise(32), inputs=[torch.randn(4, 6)[:, ::2], torch.randn(1, 3)])
    check(path, pointwise(32), inputs=[torch.randn(3).expand(5, 3), torch.randn(5, 1)])


@pytest.fixture(scope="module")
def helpers(tmp_path_factory) -> dict:
    """The layout helpers a generated candidate carries, run here on their own."""
    path = tmp_path_factory.mktemp("layout") / "problem.py"
    path.write_text(layout_problem("x", "torch.relu(x)", ["torch.randn(2, 3)"], torch.float32))
    namespace: dict = {}
    source = write_pointwise(load_site_graph(path), PointwiseConfig())
    exec(compile(source, "model_new.py", "exec"), namespace)
    return namespace


@pytest.mark.parametrize("shape,strides,expected", [
    # Same layout everywhere: one flat row.
    ((8192, 8192), [(8192, 1)], ([1], 8192 * 8192, [[0, 1]])),
    # A bias over rows: rows × columns, the bias walks columns only.
    ((64, 8192), [(8192, 1), (0, 1)], ([64], 8192, [[8192, 1], [0, 1]])),
    # Channel parameters over (B, C, H, W): channel rows of H·W, the parameter constant along.
    ((32, 256, 56, 56), [(256 * 3136, 3136, 56, 1), (0, 1, 0, 0)],
     ([32, 256, 1], 3136, [[256 * 3136, 3136, 0, 1], [0, 1, 0, 0]])),
    # A column scale: one value per row.
    ((9, 33), [(33, 1), (1, 0)], ([9], 33, [[33, 1], [1, 0]])),
    # A transposed input: its column stride is its row count.
    ((6, 37), [(1, 6), (37, 1)], ([6], 37, [[1, 6], [37, 1]])),
])
def test_the_output_splits_into_rows_and_columns(helpers, shape, strides, expected):
    rows_and_columns = helpers["_rows_and_columns"]
    sizes, n_cols, per_tensor, wide = rows_and_columns(shape, strides, max(len(shape) - 1, 1))
    assert (sizes, n_cols, per_tensor) == expected
    assert not wide


def test_offsets_past_32_bits_switch_to_64_bit_indexing(helpers):
    rows_and_columns = helpers["_rows_and_columns"]
    assert rows_and_columns((4, 8), [(2**30, 1)], 1)[3]
    assert rows_and_columns((2**16, 2**15), [(2**15, 1)], 1)[3]
    assert not rows_and_columns((2**16, 2**14), [(2**14, 1)], 1)[3]


def test_the_64_bit_kernel_variant_computes_the_same(tmp_path):
    # Tensors past 2**31 elements do not fit here; the switch is forced on small ones instead.
    path = tmp_path / "problem.py"
    path.write_text(layout_problem(*LAYOUTS["channel"], torch.float32))
    namespace: dict = {}
    exec(compile(write_pointwise(load_site_graph(path), PointwiseConfig(block=32)),
                 "model_new.py", "exec"), namespace)
    split = namespace["_rows_and_columns"]
    namespace["_rows_and_columns"] = lambda *args: (*split(*args)[:3], True)
    problem = import_problem(path)
    inputs = problem.get_inputs()
    assert_matches(namespace["ModelNew"]()(*inputs), problem.Model()(*inputs))


@pytest.mark.parametrize("n_rows,n_cols,block,expected", [
    (8192, 8192, 1024, (1, 1024)),  # long rows: one row per program
    (8192, 3136, 1024, (4, 256)),  # 56×56 maps: 256 wide pads a row by 6%, 4 rows per tile
    (8192, 49, 1024, (16, 64)),  # 7×7 maps: every power of two pads 15, keep the widest
    (1000, 3, 1024, (256, 4)),  # narrow rows: most of the tile in rows
    (1, 100, 1024, (1, 128)),  # a short flat row: no empty rows in the tile
])
def test_tiles_fill_the_block_without_padding_rows_much(helpers, n_rows, n_cols, block,
                                                        expected):
    assert helpers["_tile"](n_rows, n_cols, block) == expected


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


def test_sites_it_cannot_handle_say_why(tmp_path):
    path = tmp_path / "problem.py"
    path.write_text(
        "import torch\nimport torch.nn as nn\n\n\nclass Model(nn.Module):\n"
        "    def forward(self, x):\n        return torch.softmax(x, -1)\n\n\n"
        "def get_inputs():\n    return [torch.randn(4, 8)]\n\n\n"
        "def get_init_inputs():\n    return []\n")
    with pytest.raises(Unsupported, match="softmax is not elementwise"):
        write_pointwise(load_site_graph(path), PointwiseConfig())
