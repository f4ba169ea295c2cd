"""The rules generator on a GPU: for each family at realistic sizes, the best rules kernel
against eager, torch.compile and its roofline floor. Prints one table.

    python bench/rules_generator_bench.py [--workers 4] [--evaluations 24] [--only NAME]
        [--writers all|compiler]

Each site is searched as `core.optimize` searches it: a tree of the generator's kernels
(Triton, and CUDA where the family has it) ranked by UCT on the latency the evaluator measures
on the GPU against the faster of the site's eager and compiled times, until 12 evaluations
bring no new best or `--evaluations` kernels were judged. The fastest accepted kernel is the
family's result. Targets: memory-bound families at >= 85% of the byte floor and never slower
than torch.compile; matmul with epilogue within 10% of torch.compile in bf16; conv with
epilogue faster than eager. `--writers compiler` leaves pointwise and reduction sites to the
kernel compiler alone, without the pattern writers, to set its kernels beside theirs.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from core.evaluate import EvalConfig, Evaluator  # noqa: E402
from core.evaluate.site_baseline import time_site  # noqa: E402
from core.evaluate.verdict import Verdict  # noqa: E402
from core.optimize.run import feedback_of  # noqa: E402
from core.profile.gpu_peaks import device_peaks  # noqa: E402
from core.profile.roofline import GpuPeaks  # noqa: E402
from core.search.tree import Node, SearchConfig, SiteSearch  # noqa: E402
from generators.base import Feedback, Parent, Proposal, Proposals  # noqa: E402
from generators.rules import WRITERS, RulesGenerator, Writer  # noqa: E402

COMPILER = ("write_compiled", "write_cuda_compiled")


def compiler_writers() -> tuple[Writer, ...]:
    """The rules with pointwise and reduction sites left to the kernel compiler alone."""
    return tuple(w for w in WRITERS
                 if w.family not in ("pointwise", "reduction") or w.write.__name__ in COMPILER)


@dataclass(frozen=True)
class Case:
    name: str
    family: str
    params: str
    body: str
    inputs: str
    bytes: int
    flops: int = 0
    tiers: tuple[str, ...] = ("triton", "cuda")


N = 8192
CASES = [
    Case("gelu chain 8192² fp32", "pointwise", "x",
         "torch.nn.functional.gelu(x) * torch.sigmoid(x) + 0.1 * x",
         f"torch.randn({N}, {N})", 2 * N * N * 4),
    Case("bias + gelu 8192² bf16", "pointwise", "x, b", "torch.nn.functional.gelu(x + b)",
         f"torch.randn({N}, {N}).bfloat16(), torch.randn({N}).bfloat16()", 2 * N * N * 2),
    Case("softmax 8192² fp32", "reduction", "x", "torch.softmax(x, dim=-1)",
         f"torch.randn({N}, {N})", 2 * N * N * 4),
    Case("layer_norm 8192×4096 fp32", "reduction", "x, w, b",
         "torch.nn.functional.layer_norm(x, (4096,), w, b)",
         f"torch.randn({N}, 4096), torch.randn(4096), torch.randn(4096)", 2 * N * 4096 * 4),
    Case("rms_norm 8192×4096 bf16", "reduction", "x, w",
         "torch.nn.functional.rms_norm(x, (4096,), w, 1e-6)",
         f"torch.randn({N}, 4096).bfloat16(), torch.randn(4096).bfloat16()", 2 * N * 4096 * 2),
    Case("linear + gelu 4096³ bf16", "matmul", "x, w, b",
         "torch.nn.functional.gelu(torch.nn.functional.linear(x, w, b))",
         "torch.randn(4096, 4096).bfloat16(), (torch.randn(4096, 4096) / 64).bfloat16(), "
         "torch.randn(4096).bfloat16()", 3 * 4096 * 4096 * 2, 2 * 4096**3, ("triton",)),
    Case("conv3x3 + bn + relu, 32×256×56² bf16", "conv", "x, w, m, v, g, b",
         "torch.relu(torch.nn.functional.batch_norm(torch.nn.functional.conv2d(x, w, None, 1, 1),"
         " m, v, g, b, False, 0.1, 1e-5))",
         "torch.randn(32, 256, 56, 56).bfloat16(), (torch.randn(256, 256, 3, 3) / 48).bfloat16(),"
         " torch.randn(256).bfloat16(), (torch.rand(256) + 0.5).bfloat16(),"
         " torch.randn(256).bfloat16(), torch.randn(256).bfloat16()",
         2 * 32 * 256 * 56 * 56 * 2, 2 * 32 * 256 * 56 * 56 * 256 * 9, ("triton",)),
    Case("group_norm(32) + silu, 16×512×64² fp32", "reduction", "x, w, b",
         "torch.nn.functional.silu(torch.nn.functional.group_norm(x, 32, w, b))",
         "torch.randn(16, 512, 64, 64), torch.randn(512), torch.randn(512)",
         2 * 16 * 512 * 64 * 64 * 4),
    Case("group_norm(32) + silu, channels-last, 16×512×64² fp32", "reduction", "x, w, b",
         "torch.nn.functional.silu(torch.nn.functional.group_norm(x, 32, w, b))",
         "torch.randn(16, 512, 64, 64).to(memory_format=torch.channels_last), "
         "torch.randn(512), torch.randn(512)", 2 * 16 * 512 * 64 * 64 * 4),
    Case("batch_norm, batch statistics, 32×256×56² fp32", "reduction", "x, w, b",
         "torch.nn.functional.batch_norm(x, None, None, w, b, True, 0.1, 1e-5)",
         "torch.randn(32, 256, 56, 56), torch.randn(256), torch.randn(256)",
         2 * 32 * 256 * 56 * 56 * 4),
    Case("instance_norm, 32×64×512² fp32", "reduction", "x",
         "torch.nn.functional.instance_norm(x)", "torch.randn(32, 64, 512, 512)",
         2 * 32 * 64 * 512 * 512 * 4),
    Case("l2 norm over rows of 65535, 8192×65535 fp32", "reduction", "x",
         "x / torch.norm(x, p=2, dim=1, keepdim=True)", "torch.randn(8192, 65535)",
         2 * 8192 * 65535 * 4),
    Case("sum over dim 1, 64×2048×512 fp32", "reduction", "x", "x.sum(dim=1)",
         "torch.randn(64, 2048, 512)", 64 * 2048 * 512 * 4, tiers=("triton",)),
    Case("amax over dim 0, 8192² fp32", "reduction", "x", "x.amax(dim=0)",
         f"torch.randn({N}, {N})", N * N * 4, tiers=("triton",)),
    Case("softmax over dim 1, 32×256×64² fp32", "reduction", "x", "torch.softmax(x, dim=1)",
         "torch.randn(32, 256, 64, 64)", 2 * 32 * 256 * 64 * 64 * 4, tiers=("triton",)),
]


def floor_ms(case: Case, peaks: GpuPeaks) -> float:
    """The case's roofline floor on the GPU of `peaks`: its bytes at the copy bandwidth, or its
    FLOPs in bf16."""
    return max(case.bytes / peaks.bandwidth, case.flops / peaks.matrix_flops["bf16"]) * 1e3


def problem_source(case: Case) -> str:
    return ("import torch\nimport torch.nn as nn\n\n\nclass Model(nn.Module):\n"
            f"    def forward(self, {case.params}):\n        return {case.body}\n\n\n"
            f"def get_inputs():\n    return [{case.inputs}]\n\n\n"
            "def get_init_inputs():\n    return []\n")


def drafts_and_children(generator: RulesGenerator, problem: Path, tiers: tuple[str, ...],
                        children: int) -> list[Proposal]:
    """The generator's drafts in each tier, then `children` children of every draft."""
    drafts = []
    for tier in tiers:
        drafts += generator.propose(problem, None, n=3, tiers=(tier,)).children
    proposals = list(drafts)
    for draft in drafts:
        proposals += generator.propose(problem, Parent(draft), n=children,
                                       tiers=(draft.tier,)).children
    return proposals


HEADER = (f"{'site':48}{'tier':>7}{'best ms':>9}{'eager':>8}{'compile':>9}{'floor':>8}"
          f"{'x eager':>8}{'x comp':>8}{'% floor':>8}  best kernel")


def row_text(case: Case, best: tuple | None, eager: float, compiled: float, floor: float,
             tried: int) -> str:
    if best is None:
        return f"{case.name:48}{'-':>7}  no accepted kernel of {tried}"
    verdict, proposal = best
    ms = verdict.latency_ms
    return (f"{case.name:48}{proposal.tier:>7}{ms:9.4f}{eager:8.4f}{compiled:9.4f}"
            f"{floor:8.4f}{eager / ms:8.2f}{compiled / ms:8.2f}{100 * floor / ms:7.0f}%  "
            f"{settings_text(proposal)}")


def settings_text(proposal: Proposal) -> str:
    """The best kernel's writer and knobs, compactly: `write_pointwise block=4096 ...`."""
    knobs = {k: v for k, v in proposal.settings.items() if k != "writer"}
    return " ".join([str(proposal.settings.get("writer", "?"))]
                    + [f"{k}={v}" for k, v in knobs.items()])


def search_case(generator: RulesGenerator, evaluator: Evaluator, problem: Path,
                tiers: tuple[str, ...], baseline_ms: float, floor_ms: float,
                evaluations: int) -> list[tuple[Verdict, Proposal]]:
    """Every kernel the tree search judged on `problem`, with its verdict."""
    judged: list[tuple[Verdict, Proposal]] = []

    def propose(parent: Parent | None, n: int) -> Proposals:
        return generator.propose(problem, parent, n, tiers)

    def evaluate(proposals: list[Proposal]) -> list[Feedback]:
        verdicts = evaluator.evaluate_many([(problem, p.source) for p in proposals])
        judged.extend(zip(verdicts, proposals, strict=True))
        return [feedback_of(v, floor_ms) for v in verdicts]

    def record(node: Node) -> None:
        del node  # the bench keeps its own list of what was judged

    # No stop near the floor: `core.optimize` skips a site whose compiled time is already
    # within 90% of it, but the question here is how close the rules themselves get.
    search = SiteSearch(baseline_ms, floor_ms, propose, evaluate, record,
                        SearchConfig(floor_fraction=1.0))
    while not search.done and search.evaluations < evaluations:
        if not search.step(limit=evaluations - search.evaluations):
            break
    return judged


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--evaluations", type=int, default=24,
                        help="kernels judged per site at most")
    parser.add_argument("--only", default="",
                        help="comma-separated: cases whose name contains one of these")
    parser.add_argument("--save", type=Path, help="write every case's best kernel to this file")
    parser.add_argument("--writers", choices=("all", "compiler"), default="all",
                        help="compiler: pointwise and reduction sites by the kernel compiler alone")
    args = parser.parse_args()
    generator = RulesGenerator(compiler_writers() if args.writers == "compiler" else WRITERS)
    rows, kept = [], []
    peaks = device_peaks("cuda")
    with tempfile.TemporaryDirectory(prefix="kiln-rules-bench-") as folder, \
            Evaluator(EvalConfig(device="cuda"), workers=args.workers) as evaluator:
        for index, case in enumerate(
                c for c in CASES if any(part in c.name for part in args.only.split(","))):
            problem = Path(folder) / f"case{index}" / "problem.py"
            problem.parent.mkdir()
            problem.write_text(problem_source(case))
            baseline = time_site(problem, EvalConfig(device="cuda"))
            eager, compiled = baseline.eager_ms, baseline.compile_ms
            floor = floor_ms(case, peaks)
            judged = search_case(generator, evaluator, problem, case.tiers, baseline.best_ms,
                                 floor, args.evaluations)
            accepted = [(v, p) for v, p in judged if v.accepted]
            rejected = [v.reason for v, _ in judged if not v.accepted]
            best = min(accepted, key=lambda a: a[0].latency_ms, default=None)
            if best is not None:
                kept.append(f"# ===== {case.name}: {best[0].latency_ms:.4f} ms\n{best[1].source}")
            rows.append(row_text(case, best, eager, compiled, floor, len(judged)))
            print(f"{case.name}: {len(accepted)}/{len(judged)} accepted"
                  + (f"; first rejection: {rejected[0]}" if rejected else ""), flush=True)
            print(rows[-1], flush=True)
    if args.save is not None:
        args.save.write_text("\n\n".join(kept))
    print(f"\n{HEADER}")
    print("\n".join(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
