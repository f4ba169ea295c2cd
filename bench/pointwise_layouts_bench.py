"""Compiled pointwise kernels (and the CUDA pointwise writer's) on broadcast layouts, on a GPU:
accepted? how close to the byte floor? Prints one table; writes nothing outside a temporary
folder.

    python bench/pointwise_layouts_bench.py [--trials 100] [--warmup 10] [--only NAME]

Each site is a pointwise chain (or a conv with its epilogue) whose inputs broadcast in one of
the patterns the compiler's rows and columns handle: a row bias, a column scale, per-channel batch
norm, a scalar-like (1, 1), a transposed input. Every config is judged by the evaluator (its
correctness checks and its timing against eager); torch.compile is timed here by the same rules.
Targets: memory-bound sites at >= 85% of the byte floor (bytes at 4.3 TB/s); the conv site
faster than eager. The transposed site reads uncoalesced by design and shows the general path.
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
from core.evaluate.site_baseline import time_site  # noqa: E402
from core.profile.roofline import GpuPeaks  # noqa: E402
from core.runtime.errors import KilnInputError, exit_on_input_error  # noqa: E402
from generators.cuda.pointwise import CudaPointwiseConfig, write_cuda_pointwise  # noqa: E402
from generators.site_graph import SiteGraph, load_site_graph  # noqa: E402
from generators.triton.program import compiled_drafts, write_compiled  # noqa: E402

CUDA_CONFIGS = [CudaPointwiseConfig(), CudaPointwiseConfig(threads=512, blocks_per_sm=8)]
N = 8192
BN = "torch.nn.functional.batch_norm({}, m, v, g, b, False, 0.1, 1e-5)"
CHANNELS = ["256", "256", "256", "256"]


@dataclass(frozen=True)
class Site:
    name: str
    params: str
    body: str
    draws: list[str]  # full size, `{}` is the dtype
    small: list[str]  # the same ops on small tensors: the graph is read from these
    bytes: int  # moved at least once: the floor
    family: str = "pointwise"


SITES = [
    Site("row bias + gelu 8192² bf16", "x, b", "torch.nn.functional.gelu(x + b)",
         [f"torch.randn({N}, {N})", f"torch.randn({N})"], ["5, 40", "40"], 2 * N * N * 2),
    Site("column scale 8192² bf16", "x, s", "x * s + x",
         [f"torch.randn({N}, {N})", f"torch.randn({N}, 1)"], ["5, 40", "5, 1"], 2 * N * N * 2),
    Site("batch norm + relu 32×256×56² bf16", "x, m, v, g, b",
         f"torch.relu({BN.format('x')})", ["torch.randn(32, 256, 56, 56)", *CHANNELS],
         ["2, 4, 5, 6", "4", "4", "4", "4"], 2 * 32 * 256 * 56 * 56 * 2),
    Site("scalar-like (1, 1) 8192² fp32", "x, s", "torch.tanh(x - s)",
         [f"torch.randn({N}, {N})", "torch.randn(1, 1)"], ["5, 40", "1, 1"], 2 * N * N * 4),
    Site("transposed + bias 8192² fp32", "x, b", "torch.relu(x) + b",
         [f"torch.randn({N}, {N}).t()", f"torch.randn({N})"], ["torch.randn(40, 5).t()", "40"],
         2 * N * N * 4),
    Site("conv3x3 + bn + relu 32×256×56² bf16", "x, w, m, v, g, b",
         f"torch.relu({BN.format('torch.nn.functional.conv2d(x, w, None, 1, 1)')})",
         ["torch.randn(32, 256, 56, 56)", "torch.randn(256, 256, 3, 3) / 48", *CHANNELS],
         ["2, 4, 5, 6", "4, 4, 3, 3", "4", "4", "4", "4"], 2 * 32 * 256 * 56 * 56 * 2, "conv"),
]
DTYPES = {"bf16": "torch.bfloat16", "fp32": "torch.float32"}


def problem_source(site: Site, shapes: list[str]) -> str:
    dtype = DTYPES[site.name.split()[-1]]
    names = [n.strip() for n in site.params.split(",")]
    draws = []
    for name, draw in zip(names, shapes, strict=True):
        draw = draw if draw.startswith("torch.") else f"torch.randn({draw})"
        if name == "v":
            draw = f"({draw}.abs() + 0.5)"
        if draw.endswith(".t()"):
            draws.append(f"{draw[:-4]}.to({dtype}).t()")
        else:
            draws.append(f"({draw}).to({dtype})")
    return ("import torch\nimport torch.nn as nn\n\n\nclass Model(nn.Module):\n"
            f"    def forward(self, {site.params}):\n        return {site.body}\n\n\n"
            f"def get_inputs():\n    return [{', '.join(draws)}]\n\n\n"
            "def get_init_inputs():\n    return []\n")


def candidates(site: Site, graph: SiteGraph) -> list[tuple[str, str]]:
    compiled = [(f"triton {s.describe()}", write_compiled(graph, s))
                for s, _ in compiled_drafts(graph)]
    if site.family == "conv":
        return compiled
    return compiled + [(f"cuda {c.describe()}", write_cuda_pointwise(graph, c))
                       for c in CUDA_CONFIGS]


def check_site(site: Site, folder: Path, config: EvalConfig) -> None:
    problem, small = folder / "problem.py", folder / "small" / "problem.py"
    small.parent.mkdir(parents=True)
    problem.write_text(problem_source(site, site.draws))
    small.write_text(problem_source(site, site.small))
    compiled = time_site(problem, config).compile_ms
    floor = site.bytes / GpuPeaks().bandwidth * 1e3
    print(f"\n{site.name}: torch.compile {compiled:.4f} ms, byte floor {floor:.4f} ms")
    print("| config | verdict | ms | eager ms | vs eager | vs compile | % of floor |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for label, source in candidates(site, load_site_graph(small)):
        verdict = evaluate(problem, source, config)
        if not verdict.accepted:
            print(f"| {label} | rejected: {verdict.reason.splitlines()[0]} | | | | | |")
            continue
        ms = verdict.latency_ms
        print(f"| {label} | accepted | {ms:.4f} | {verdict.baseline_ms:.4f} | "
              f"{verdict.baseline_ms / ms:.2f}x | {compiled / ms:.2f}x | {100 * floor / ms:.0f}% |",
              flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=100)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--only", default="", help="sites whose name contains this")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise KilnInputError("this check times kernels on an NVIDIA GPU and none is visible",
                             "run it on a GPU host")
    config = EvalConfig(device="cuda", warmup=args.warmup, trials=args.trials)
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}")
    with tempfile.TemporaryDirectory() as tmp:
        for index, site in enumerate(s for s in SITES if args.only in s.name):
            check_site(site, Path(tmp) / f"site{index}", config)
    return 0


if __name__ == "__main__":
    exit_on_input_error(main)
