"""Rules-generated matmul and conv-epilogue kernels on a GPU: accepted? faster than eager and
torch.compile? Prints one table per site; writes nothing outside a temporary folder.

    python bench/generator_matmul_check.py [--trials 100] [--warmup 10]

Sites: linear + gelu, bf16, 4096³; ResNet-style conv3x3 + batch norm + relu (batch 32, 256
channels, 56×56), bf16 and fp32. Each candidate goes through the evaluator (correctness and its
timing against eager); torch.compile of the same problem Model is timed here by the evaluator's
rules (L2 flushed, inputs rotated, median of trials).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from core.evaluate import EvalConfig, evaluate  # noqa: E402
from core.profile.load import import_file  # noqa: E402
from core.runtime.errors import KilnInputError, exit_on_input_error  # noqa: E402
from core.timing.model_timing import rotation_sets, time_model  # noqa: E402
from generators.site_graph import load_site_graph  # noqa: E402
from generators.triton.matmul import MatmulConfig, write_triton_matmul  # noqa: E402
from generators.triton.program import compiled_drafts, write_compiled  # noqa: E402

MATMUL_CONFIGS = [
    MatmulConfig(block_m=128, block_n=128, block_k=64, group_m=8, num_warps=8, num_stages=3),
    MatmulConfig(block_m=128, block_n=256, block_k=64, group_m=8, num_warps=8, num_stages=3),
    MatmulConfig(block_m=128, block_n=128, block_k=32, group_m=8, num_warps=4, num_stages=4),
    MatmulConfig(block_m=64, block_n=128, block_k=64, group_m=8, num_warps=4, num_stages=4),
]


@dataclass(frozen=True)
class Site:
    name: str
    forward: str  # body of Model.forward, returning the site's value
    arguments: str
    shapes: list[str]  # full size, for timing
    small_shapes: list[str]  # same ops on small tensors: the graph is read from these
    dtype: str
    family: str


SITES = [
    Site("linear + gelu, bf16, 4096³", "torch.nn.functional.gelu("
         "torch.nn.functional.linear(x, w, b))", "x, w, b",
         ["4096, 4096", "4096, 4096", "4096"], ["32, 48", "40, 48", "40"], "torch.bfloat16",
         "matmul"),
    *(Site(f"conv3x3 + bn + relu, {label}, 32×256×56×56", "torch.relu("
           "torch.nn.functional.batch_norm(torch.nn.functional.conv2d(x, w, None, 1, 1), "
           "mean, var, g, b, False, 0.1, 1e-5))", "x, w, mean, var, g, b",
           ["32, 256, 56, 56", "256, 256, 3, 3", "256", "256", "256", "256"],
           ["2, 8, 7, 7", "8, 8, 3, 3", "8", "8", "8", "8"], dtype, "conv")
      for label, dtype in (("bf16", "torch.bfloat16"), ("fp32", "torch.float32"))),
]


def problem_source(site: Site, shapes: list[str]) -> str:
    names = [n.strip() for n in site.arguments.split(",")]
    draws = ", ".join(
        f"(torch.rand({s}) + 0.5).to({site.dtype})" if name == "var"
        else f"(torch.randn({s}) * {0.02 if name == 'w' else 1.0}).to({site.dtype})"
        for name, s in zip(names, shapes, strict=True))
    return ("import torch\nimport torch.nn as nn\n\n\nclass Model(nn.Module):\n"
            f"    def forward(self, {site.arguments}):\n        return {site.forward}\n\n\n"
            f"def get_inputs():\n    return [{draws}]\n\n\ndef get_init_inputs():\n"
            "    return []\n")


def compiled_ms(problem: Path, warmup: int, trials: int) -> float:
    module = import_file(problem, "kiln_bench_compiled_site")
    device = torch.device("cuda")
    model = torch.compile(module.Model())
    torch.manual_seed(0)
    inputs = [t.to(device) for t in module.get_inputs()]
    input_sets = rotation_sets(inputs, device, 1 << 30)
    return time_model(model, input_sets, device, warmup, trials).median_ms


def candidates(site: Site, problem: Path, small_problem: Path) -> list[tuple[str, str]]:
    """The matmul writer's settings (its source is shape-generic: written from the small twin),
    or a conv site's compiled drafts (written for the site's own shapes)."""
    if site.family == "matmul":
        graph = load_site_graph(small_problem)
        return [(c.describe(), write_triton_matmul(graph, c)) for c in MATMUL_CONFIGS]
    graph = load_site_graph(problem)
    return [(s.describe(), write_compiled(graph, s)) for s, _ in compiled_drafts(graph)]


def check_site(site: Site, folder: Path, config: EvalConfig) -> None:
    problem, small = folder / "problem.py", folder / "small" / "problem.py"
    small.parent.mkdir(parents=True)
    problem.write_text(problem_source(site, site.shapes))
    small.write_text(problem_source(site, site.small_shapes))
    compiled = compiled_ms(problem, config.warmup_count, config.trial_count)
    print(f"\n{site.name}: torch.compile {compiled:.3f} ms")
    print("| config | verdict | ms | eager ms | vs eager | vs compile | max rel err |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for label, source in candidates(site, problem, small):
        verdict = evaluate(problem, source, config)
        if not verdict.accepted:
            print(f"| {label} | rejected: {verdict.reason.splitlines()[0]} | | | | | |")
            continue
        print(f"| {label} | accepted ({verdict.tolerance_name}) | {verdict.latency_ms:.3f} | "
              f"{verdict.baseline_ms:.3f} | {verdict.baseline_ms / verdict.latency_ms:.2f}x | "
              f"{compiled / verdict.latency_ms:.2f}x | {verdict.max_rel_err:.2g} |")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=100)
    parser.add_argument("--warmup", type=int, default=10)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise KilnInputError("this check times kernels on an NVIDIA GPU and none is visible",
                             "run it on a GPU host")
    config = EvalConfig(device="cuda", warmup=args.warmup, trials=args.trials)
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}")
    with tempfile.TemporaryDirectory() as tmp:
        for index, site in enumerate(SITES):
            folder = Path(tmp) / f"site{index}"
            check_site(site, folder, config)
    return 0


if __name__ == "__main__":
    exit_on_input_error(main)
