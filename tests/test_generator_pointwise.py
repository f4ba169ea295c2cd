"""Rules Triton for pointwise sites: random chains, broadcasts, strides and dtypes."""

from __future__ import annotations

import random

import pytest
import torch

from generators.site_graph import Unsupported, load_site_graph
from generators.triton_pointwise import PointwiseConfig, write_pointwise
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


def test_strided_inputs_take_the_strided_path(tmp_path):
    path = tmp_path / "problem.py"
    path.write_text(
        "import torch\nimport torch.nn as nn\n\n\nclass Model(nn.Module):\n"
        "    def forward(self, in0, in1):\n        return torch.relu(in0) * in1\n\n\n"
        "def get_inputs():\n    return [torch.randn(6, 5), torch.randn(6, 5)]\n\n\n"
        "def get_init_inputs():\n    return []\n")
    transposed = torch.randn(5, 6).t()
    check(path, pointwise(16), inputs=[transposed, torch.randn(6, 5)])
    check(path, pointwise(16), inputs=[torch.randn(9, 5), torch.randn(9, 5)])


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
