"""Reductions and softmax over a non-last dimension on a GPU: every draft of the dimension
writers plus a ladder of their knobs, each against eager, torch.compile and the byte floor.
Prints one table per site.

    python bench/dim_kernels_bench.py [--workers 4] [--only NAME]

Targets: the best kernel of each site at >= 85% of the byte floor and never slower than
torch.compile. The table shows which split (reductions) or tile (softmax) gets there, so the
drafts' defaults can be set from it.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.ladder_bench import print_ranked  # noqa: E402
from core.evaluate import EvalConfig, Evaluator  # noqa: E402
from core.evaluate.site_baseline import time_site  # noqa: E402
from core.profile.roofline import GpuPeaks  # noqa: E402
from generators.rules import _dim_drafts, _dim_softmax_drafts  # noqa: E402
from generators.site_graph import load_site_graph  # noqa: E402
from generators.triton.dim_reduction import AUTO_SPLIT, DimConfig, write_dim_reduction  # noqa: E402
from generators.triton.dim_softmax import DimSoftmaxConfig, write_dim_softmax  # noqa: E402

PEAKS = GpuPeaks()


@dataclass(frozen=True)
class Site:
    name: str
    body: str
    inputs: str
    bytes: int


REDUCTIONS = [
    Site("sum over dim 1, 64×2048×512 fp32", "x.sum(dim=1)", "torch.randn(64, 2048, 512)",
         64 * 2048 * 512 * 4),
    Site("amax over dim 0, 8192² fp32", "x.amax(dim=0)", "torch.randn(8192, 8192)",
         8192 * 8192 * 4),
    Site("mean over dim 1, 32×2048×1024 bf16", "x.mean(dim=1)",
         "torch.randn(32, 2048, 1024).bfloat16()", 32 * 2048 * 1024 * 2),
]
SOFTMAXES = [
    Site("softmax over dim 1, 32×256×64² fp32", "torch.softmax(x, dim=1)",
         "torch.randn(32, 256, 64, 64)", 2 * 32 * 256 * 64 * 64 * 4),
    Site("softmax over dim 1, 16×150×128² fp32", "torch.softmax(x, dim=1)",
         "torch.randn(16, 150, 128, 128)", 2 * 16 * 150 * 128 * 128 * 4),
    Site("log_softmax over dim 1, 8×1024×64² bf16 (online)", "torch.log_softmax(x, dim=1)",
         "torch.randn(8, 1024, 64, 64).bfloat16()", 2 * 8 * 1024 * 64 * 64 * 2),
]


def reduction_configs(graph) -> list[object]:
    configs = [config for config, _ in _dim_drafts(graph)]
    configs += [DimConfig(split=split) for split in (2, 4, 8, 16, 32)]
    configs += [DimConfig(split=AUTO_SPLIT, programs_per_sm=p) for p in (2, 8)]
    configs += [DimConfig(block_r=32, split=AUTO_SPLIT), DimConfig(block_i=256, split=AUTO_SPLIT),
                DimConfig(block_r=8, block_i=256, num_warps=8, split=AUTO_SPLIT)]
    return list(dict.fromkeys(configs))


def softmax_configs(graph) -> list[object]:
    configs = [config for config, _ in _dim_softmax_drafts(graph)]
    configs += [DimSoftmaxConfig(tile=tile, num_warps=warps)
                for tile, warps in ((4096, 4), (8192, 4), (16384, 16))]
    configs += [DimSoftmaxConfig(block_i=128, tile=16384, num_warps=16),
                DimSoftmaxConfig(block_i=64, tile=16384, num_warps=16)]
    return list(dict.fromkeys(configs))


def problem_source(site: Site) -> str:
    return ("import torch\nimport torch.nn as nn\n\n\nclass Model(nn.Module):\n"
            f"    def forward(self, x):\n        return {site.body}\n\n\n"
            f"def get_inputs():\n    return [{site.inputs}]\n\n\n"
            "def get_init_inputs():\n    return []\n")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--only", default="",
                        help="comma-separated: sites whose name contains one of these")
    args = parser.parse_args()
    plans = [(site, write_dim_reduction, reduction_configs) for site in REDUCTIONS]
    plans += [(site, write_dim_softmax, softmax_configs) for site in SOFTMAXES]
    plans = [p for p in plans if any(part in p[0].name for part in args.only.split(","))]
    with tempfile.TemporaryDirectory(prefix="kiln-dim-bench-") as folder, \
            Evaluator(EvalConfig(device="cuda"), workers=args.workers) as evaluator:
        for index, (site, write, configs_of) in enumerate(plans):
            problem = Path(folder) / f"site{index}" / "problem.py"
            problem.parent.mkdir()
            problem.write_text(problem_source(site))
            graph = load_site_graph(problem)
            configs = configs_of(graph)
            verdicts = evaluator.evaluate_many([(problem, write(graph, c)) for c in configs])
            baseline = time_site(problem, EvalConfig(device="cuda"))
            floor = site.bytes / PEAKS.bandwidth * 1e3
            print(f"\n{site.name}: eager {baseline.eager_ms:.4f} ms, compile "
                  f"{baseline.compile_ms:.4f} ms, byte floor {floor:.4f} ms")
            print_ranked([(str(c), v) for c, v in zip(configs, verdicts, strict=True)], floor,
                         baseline.compile_ms, "configuration")
    return 0


if __name__ == "__main__":
    sys.exit(main())
