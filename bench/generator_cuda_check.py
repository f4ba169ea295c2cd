"""The rules CUDA generator on a GPU at realistic sizes: each family's candidates for sites of
64 MB and more, judged by the evaluator (correctness, then timing against the faster of eager and
torch.compile). Prints one table; writes nothing outside a temporary folder.

    python bench/generator_cuda_check.py [--only softmax] [--workers 1]

Achieved bandwidth counts each input and output tensor once (the byte floor), against the H200's
device-to-device copy rate of about 4.3 TB/s.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from core.evaluate import EvalConfig, Evaluator  # noqa: E402
from generators.cuda.pointwise import CudaPointwiseConfig, write_cuda_pointwise  # noqa: E402
from generators.cuda.row_reduction import CudaReductionConfig, write_cuda_reduction  # noqa: E402
from generators.site_graph import load_site_graph  # noqa: E402

PEAK_TB_S = 4.3


@dataclass(frozen=True)
class Site:
    name: str
    family: str  # "pointwise" or "reduction"
    params: str
    body: str
    inputs: str  # the get_inputs() list
    bytes_moved: int  # every input and output tensor once


SITES = [
    Site("gelu chain 8192x8192 fp32", "pointwise", "x",
         "v = torch.nn.functional.gelu(x)\n        v = v * torch.sigmoid(v) + 0.1 * x",
         "torch.randn(8192, 8192)", 2 * 8192 * 8192 * 4),
    Site("bias+gelu 8192x8192 bf16 (broadcast)", "pointwise", "x, b",
         "v = torch.nn.functional.gelu(x + b)",
         "torch.randn(8192, 8192).bfloat16(), torch.randn(8192).bfloat16()",
         2 * 8192 * 8192 * 2),
    Site("softmax 8192x8192 fp32", "reduction", "x", "v = torch.softmax(x, dim=-1)",
         "torch.randn(8192, 8192)", 2 * 8192 * 8192 * 4),
    Site("layernorm 8192x4096 fp32", "reduction", "x, w, b",
         "v = torch.nn.functional.layer_norm(x, (4096,), w, b, 1e-5)",
         "torch.randn(8192, 4096), torch.randn(4096), torch.randn(4096)", 2 * 8192 * 4096 * 4),
    Site("rmsnorm 8192x4096 bf16", "reduction", "x, w",
         "v = torch.nn.functional.rms_norm(x, (4096,), w, 1e-6)",
         "torch.randn(8192, 4096).bfloat16(), torch.randn(4096).bfloat16()",
         2 * 8192 * 4096 * 2),
    Site("sum(-1) 8192x8192 fp32", "reduction", "x", "v = x.sum(-1)",
         "torch.randn(8192, 8192)", 8192 * 8192 * 4 + 8192 * 4),
]
POINTWISE_CONFIGS = [CudaPointwiseConfig(), CudaPointwiseConfig(threads=512, blocks_per_sm=8),
                     CudaPointwiseConfig(vector_bytes=8)]
REDUCTION_CONFIGS = [CudaReductionConfig(), CudaReductionConfig(threads=512),
                     CudaReductionConfig(threads=1024), CudaReductionConfig(threads=256,
                                                                            rows_per_block=2)]


def problem(site: Site) -> str:
    return ("import torch\nimport torch.nn as nn\n\n\nclass Model(nn.Module):\n"
            f"    def forward(self, {site.params}):\n        {site.body}\n        return v\n\n\n"
            f"def get_inputs():\n    return [{site.inputs}]\n\n\n"
            "def get_init_inputs():\n    return []\n")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", type=str, default="",
                        help="run only the sites whose name contains this text")
    parser.add_argument("--workers", type=int, default=1)
    args = parser.parse_args()
    jobs, labels = [], []
    with tempfile.TemporaryDirectory(prefix="kiln-cuda-check-") as folder:
        for index, site in enumerate(s for s in SITES if args.only in s.name):
            path = Path(folder) / f"site{index}" / "problem.py"
            path.parent.mkdir()
            path.write_text(problem(site))
            graph = load_site_graph(path)
            if site.family == "pointwise":
                sources = [(c.describe(), write_cuda_pointwise(graph, c))
                           for c in POINTWISE_CONFIGS]
            else:
                sources = [(c.describe(), write_cuda_reduction(graph, c))
                           for c in REDUCTION_CONFIGS]
            for describe, source in sources:
                jobs.append((path, source))
                labels.append((site, describe))
        with Evaluator(EvalConfig(device="cuda"), workers=args.workers) as evaluator:
            verdicts = evaluator.evaluate_many(jobs)
    print(f"{'site':38} {'config':42} {'ok':>3} {'ms':>8} {'base ms':>8} {'speedup':>7} "
          f"{'TB/s':>6} {'of peak':>7}  reason")
    rejected = 0
    for (site, describe), verdict in zip(labels, verdicts, strict=True):
        rejected += not verdict.accepted
        latency = verdict.latency_ms
        rate = site.bytes_moved / (latency * 1e-3) / 1e12 if latency else None
        print(f"{site.name:38} {describe:42} {'yes' if verdict.accepted else 'no':>3} "
              f"{_fmt(latency, 4):>8} {_fmt(verdict.baseline_ms, 4):>8} "
              f"{_fmt(verdict.speedup, 2):>7} {_fmt(rate, 2):>6} "
              f"{_fmt(rate and 100 * rate / PEAK_TB_S, 0):>6}%  {verdict.reason}")
    return 1 if rejected else 0


def _fmt(value: float | None, digits: int) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


if __name__ == "__main__":
    sys.exit(main())
