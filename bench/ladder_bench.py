"""Knob ladders of the rules writers on a GPU, for the sites that sit near their targets: every
setting judged by the evaluator and timed against eager, torch.compile and the floor.

    python bench/ladder_bench.py [--workers 2]
        [--only norms,compiled_norms,rows,long_rows,matmul,pointwise,dims]

- norms: group norm + SiLU, instance norm and batch norm (batch statistics), the cluster CUDA
  kernel at each cluster size × threads (vector 4), its share held in shared memory or in
  registers, against the Triton writers' drafts;
- compiled_norms: the same three norms under the compiler's own schedules, which are to take
  the cluster norm kernel's place: a program a set in both tiers, and (CUDA) each set shared by
  a cluster of 2, 4 or 8 blocks, its share kept in registers or shared memory, or read again;
- rows: an L2 norm over rows of 65535, the compiler's schedules in both tiers: a program a row,
  a program per SM striding over the rows, and (CUDA) each row shared by a cluster of blocks,
  its share kept in registers or shared memory, or read again;
- long_rows: a softmax over rows of 393216 (1.5 MB, 23_Softmax's rows), the compiler's schedules:
  the CUDA tier's drafts, a program a row in both tiers, and (CUDA) each row shared by a
  cluster of 4, 8 or 16 blocks of 512 or 1024 threads, its share kept in shared memory or
  registers, or read again;
- matmul: linear + GELU 4096³ bf16 over tile shapes, warps, stages and GROUP_M;
- pointwise: bias + GELU 8192² bf16 over block sizes and warps;
- dims: sum over dim 1 of 64×2048×512 fp32, the compiler's rows side by side over tile
  shapes, warps and split loops.

Sites and floors are those of `bench/rules_generator_bench.py`, and the long rows' own. Prints
one table per site, fastest first; a rejected setting shows the evaluator's reason.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.rules_generator_bench import CASES, Case, floor_ms, problem_source  # noqa: E402
from core.evaluate import EvalConfig, Evaluator  # noqa: E402
from core.evaluate.site_baseline import time_site  # noqa: E402
from core.evaluate.verdict import Verdict  # noqa: E402
from generators.compiler.launches import main_kernel  # noqa: E402
from generators.compiler.schedule import Schedule, cuda_drafts  # noqa: E402
from generators.compiler.site import program_of  # noqa: E402
from generators.cuda.channel_norm import write_cuda_channel_norm  # noqa: E402
from generators.cuda.cluster_shares import ClusterNormConfig  # noqa: E402
from generators.cuda.program import write_cuda_compiled  # noqa: E402
from generators.rules import WRITERS  # noqa: E402
from generators.site_graph import SiteGraph, Unsupported, load_site_graph  # noqa: E402
from generators.triton.matmul import MatmulConfig, write_triton_matmul  # noqa: E402
from generators.triton.program import write_compiled  # noqa: E402


@dataclass(frozen=True)
class Ladder:
    group: str
    site: str  # a part of the name of one of `CASES`
    settings: Callable[[SiteGraph], list[tuple[str, str]]]  # (label, candidate source)


def norm_settings(graph: SiteGraph) -> list[tuple[str, str]]:
    plans = []
    # Registers also at thread counts whose steps fill a batch-norm set of 32 × 56² exactly
    # (224, 448, 896 = 7 × 32, 14 × 32, 28 × 32), and at 320, batch norm's best (40 a thread).
    for held, threads in (("shared", (256, 512, 1024)),
                          ("registers", (128, 224, 256, 320, 448, 512, 896, 1024))):
        for k in (2, 4, 8):
            for t in threads:
                config = ClusterNormConfig(cluster=k, threads=t, vector=4, held=held)
                try:
                    plans.append((f"cluster {k} × {t}, vector 4, {held}",
                                  write_cuda_channel_norm(graph, config)))
                except Unsupported:
                    continue  # a share too large for registers
    plans += [(f"cluster 8 × {t}, scalar",
               write_cuda_channel_norm(graph, ClusterNormConfig(threads=t))) for t in (256, 512)]
    for writer in WRITERS:
        if writer.write.__name__ not in ("write_group_norm", "write_batch_norm"):
            continue
        for settings, _ in writer.drafts(graph):
            try:
                plans.append((f"{writer.write.__name__} {settings}", writer.write(graph, settings)))
            except Unsupported:
                break  # the other norm's writer
    return plans


def compiled_plans(graph: SiteGraph, schedules: list[tuple[str, Schedule]]
                   ) -> list[tuple[str, str]]:
    """Each (tier, schedule)'s compiled candidate, labelled; schedules the site's kernels
    cannot take (a share too large to keep in shared memory) left out."""
    write = {"triton": write_compiled, "cuda": write_cuda_compiled}
    plans = []
    for tier, schedule in schedules:
        try:
            plans.append((f"{tier}: {schedule.describe()}", write[tier](graph, schedule)))
        except Unsupported:
            continue
    return plans


def cluster_schedules(columns: tuple[int, ...], warps: tuple[int, ...]
                      ) -> list[tuple[str, Schedule]]:
    return [("cuda", Schedule(1, c, w, cluster_blocks=blocks, keep_row=keep, held=held))
            for blocks in (2, 4, 8) for c in columns for w in warps
            for keep, held in ((False, "shared"), (True, "shared"), (True, "registers"))]


def cuda_tier_drafts(graph: SiteGraph) -> list[tuple[str, Schedule]]:
    """The CUDA tier's own drafts for the site's main kernel, as a search starts from them
    (vectors of 4, shares kept in registers by the fewest threads that hold them)."""
    program = program_of(graph)
    return [("cuda", s) for s, _ in cuda_drafts(main_kernel(program))]


def compiled_norm_settings(graph: SiteGraph) -> list[tuple[str, str]]:
    """The compiler's own schedules for a norm, to set beside the cluster norm writer's: its
    CUDA drafts, a program a set in both tiers, and (CUDA) each set shared by a cluster, kept
    or read again."""
    schedules = [(tier, Schedule(1, columns, warps)) for tier in ("triton", "cuda")
                 for columns in (2048, 4096) for warps in (8, 16)]
    return compiled_plans(graph, cuda_tier_drafts(graph) + schedules
                          + cluster_schedules((2048, 4096), (8, 16)))


def row_settings(graph: SiteGraph) -> list[tuple[str, str]]:
    schedules = [(tier, Schedule(1, columns, warps, resident_per_sm=resident))
                 for tier in ("triton", "cuda") for columns in (2048, 4096)
                 for warps in (8, 16) for resident in (0, 1, 2)]
    return compiled_plans(graph, schedules + cluster_schedules((2048, 4096), (8, 16)))


# Rows longer than a cluster of 8 keeps at two blocks an SM; 3.2 GB, past the L2.
LONG_ROWS = Case("softmax over rows of 393216, 1024×393216 fp32", "reduction", "x",
                 "torch.softmax(x, dim=-1)", "torch.randn(1024, 393216)", 2 * 1024 * 393216 * 4)


def long_row_settings(graph: SiteGraph) -> list[tuple[str, str]]:
    schedules = cuda_tier_drafts(graph) + [
        (tier, Schedule(1, 4096, 16, resident_per_sm=resident))
        for tier in ("triton", "cuda") for resident in (0, 1)]
    schedules += [("cuda", Schedule(1, 4096, warps, cluster_blocks=blocks, keep_row=keep,
                                    held=held))
                  for blocks in (4, 8, 16) for warps in (16, 32)
                  for keep, held in ((False, "shared"), (True, "shared"), (True, "registers"))]
    return compiled_plans(graph, schedules)


def matmul_settings(graph: SiteGraph) -> list[tuple[str, str]]:
    shapes = [(128, 256, 64, 8, 3), (128, 256, 64, 8, 4), (128, 256, 64, 16, 3),
              (256, 128, 64, 8, 3), (256, 128, 64, 8, 4), (128, 128, 64, 4, 4),
              (128, 128, 64, 8, 4), (128, 256, 32, 8, 4)]
    configs = [MatmulConfig(m, n, k, group_m, warps, stages)
               for m, n, k, warps, stages in shapes for group_m in (8, 16)]
    return [(config.describe(), write_triton_matmul(graph, config)) for config in configs]


def pointwise_settings(graph: SiteGraph) -> list[tuple[str, str]]:
    schedules = [Schedule(1, block, warps) for block in (1024, 2048, 4096, 8192)
                 for warps in (1, 2, 4, 8)]
    return [(schedule.describe(), write_compiled(graph, schedule)) for schedule in schedules]


def dim_settings(graph: SiteGraph) -> list[tuple[str, str]]:
    """The compiler's rows side by side: rows a program (along memory), columns a step (along
    the reduced dimension), warps, and splits of each row's loop."""
    schedules = [Schedule(rows, columns, warps, splits) for rows in (16, 32, 64, 128)
                 for columns in (16, 64, 256) for warps in (4, 8) for splits in (1, 4)
                 if rows * columns <= 8192]
    return [(schedule.describe(), write_compiled(graph, schedule)) for schedule in schedules]


LADDERS = [
    Ladder("norms", "group_norm(32)", norm_settings),
    Ladder("norms", "instance_norm", norm_settings),
    Ladder("norms", "batch_norm, batch statistics", norm_settings),
    Ladder("compiled_norms", "group_norm(32)", compiled_norm_settings),
    Ladder("compiled_norms", "instance_norm", compiled_norm_settings),
    Ladder("compiled_norms", "batch_norm, batch statistics", compiled_norm_settings),
    Ladder("rows", "l2 norm over rows", row_settings),
    Ladder("long_rows", "rows of 393216", long_row_settings),
    Ladder("matmul", "linear + gelu", matmul_settings),
    Ladder("pointwise", "bias + gelu", pointwise_settings),
    Ladder("dims", "sum over dim 1", dim_settings),
]


def print_ranked(labelled: list[tuple[str, Verdict]], floor_ms: float, compile_ms: float,
                 what: str = "setting") -> None:
    """One line a kernel, fastest first: its time, share of the floor and speedup over
    torch.compile; a rejected one with the evaluator's reason."""
    print(f"{'ms':>9}{'% floor':>9}{'x comp':>8}  {what}")
    for label, verdict in sorted(labelled, key=lambda lv: lv[1].latency_ms or float("inf")):
        if not verdict.accepted:
            print(f"{'-':>9}{'':>9}{'':>8}  {label}: {verdict.reason[:120]}")
            continue
        ms = verdict.latency_ms
        print(f"{ms:9.4f}{100 * floor_ms / ms:8.0f}%{compile_ms / ms:8.2f}  {label}", flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--only",
                        default="norms,compiled_norms,rows,long_rows,matmul,pointwise,dims",
                        help="comma-separated groups: norms, compiled_norms, rows, long_rows, "
                             "matmul, pointwise, dims")
    args = parser.parse_args()
    groups = {part.strip() for part in args.only.split(",")}
    unknown = groups - {ladder.group for ladder in LADDERS}
    if unknown:
        parser.error(f"unknown group(s) {sorted(unknown)}: choose from "
                     f"{sorted({ladder.group for ladder in LADDERS})}")
    with tempfile.TemporaryDirectory(prefix="kiln-ladders-") as folder, \
            Evaluator(EvalConfig(device="cuda"), workers=args.workers) as evaluator:
        for index, ladder in enumerate(x for x in LADDERS if x.group in groups):
            (case,) = [c for c in [*CASES, LONG_ROWS] if ladder.site in c.name]
            problem = Path(folder) / f"site{index}" / "problem.py"
            problem.parent.mkdir()
            problem.write_text(problem_source(case))
            plans = ladder.settings(load_site_graph(problem))
            verdicts = evaluator.evaluate_many([(problem, source) for _, source in plans])
            baseline = time_site(problem, EvalConfig(device="cuda"))
            floor = floor_ms(case)
            print(f"\n{case.name}: eager {baseline.eager_ms:.4f} ms, compile "
                  f"{baseline.compile_ms:.4f} ms, floor {floor:.4f} ms")
            print_ranked([(label, verdict) for (label, _), verdict
                          in zip(plans, verdicts, strict=True)], floor, baseline.compile_ms)
    return 0


if __name__ == "__main__":
    sys.exit(main())
