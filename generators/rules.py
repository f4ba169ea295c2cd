"""The offline rules generator: kernels written from the site's graph, no LLM, no network.

Drafts (no parent, or a parent from another tier) are each applicable writer at its default
settings and a size-based variant; children of one of its own kernels move one knob of its
settings one step (`mutations`), the steps the parent's diagnosis asks for first. Sources
already proposed for the site are skipped, so every child is distinct.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch

from core.profile.roofline import GpuPeaks
from generators.base import Parent, Proposal, Proposals, source_digest
from generators.compiler.launches import main_kernel
from generators.compiler.schedule import Schedule, cuda_drafts, in_vectors
from generators.compiler.site import program_of
from generators.cuda.channel_norm import write_cuda_channel_norm
from generators.cuda.cluster_shares import ClusterNormConfig, register_threads
from generators.cuda.pointwise import CudaPointwiseConfig, write_cuda_pointwise
from generators.cuda.program import write_cuda_compiled
from generators.cuda.row_reduction import CudaReductionConfig, write_cuda_reduction
from generators.mutations import diagnosed_neighbours
from generators.site_graph import SiteGraph, Unsupported, load_site_graph
from generators.triton.attention import AttentionConfig, attention_drafts, write_attention
from generators.triton.batch_norm import BatchNormConfig, write_batch_norm
from generators.triton.group_norm import GroupNormConfig, write_group_norm
from generators.triton.matmul import MatmulConfig, write_triton_matmul
from generators.triton.matmul_anchor import is_anchor, pointwise_conv
from generators.triton.program import compiled_drafts, write_compiled


@dataclass(frozen=True)
class Writer:
    family: str
    tier: str
    write: Callable[[SiteGraph, object], str]
    settings_type: type
    drafts: Callable[[SiteGraph], list[tuple[object, str]]]  # settings and why
    # Another tier's writer of the same settings: a kernel of it seeds this tier at its
    # settings (the compiler's best Triton schedule, written in CUDA).
    follows: str = ""

    def settings_of(self, proposal: Proposal) -> object | None:
        """The settings a proposal of this writer was made with, or None if not its own."""
        if proposal.settings.get("writer") != self.write.__name__:
            return None
        return self._settings(proposal)

    def carried(self, proposal: Proposal) -> object | None:
        """The settings of a kernel this writer follows, or None."""
        if not self.follows or proposal.settings.get("writer") != self.follows:
            return None
        return self._settings(proposal)

    def _settings(self, proposal: Proposal) -> object:
        return self.settings_type(**{k: v for k, v in proposal.settings.items()
                                     if k != "writer"})


def _group_norm_drafts(graph: SiteGraph) -> list[tuple[object, str]]:
    drafts: list[tuple[object, str]] = [
        (GroupNormConfig(), "one program per (sample, group), 2048-element tiles, 4 warps")]
    largest = max(graph.inputs, key=lambda info: info.numel)
    if largest.numel >= 1 << 22:
        drafts.append((GroupNormConfig(block=4096, num_warps=8),
                       "large groups: 4096-element tiles with 8 warps keep more bytes in flight"))
    if largest.numel * largest.dtype.itemsize > GpuPeaks().l2_bytes:
        drafts.append((GroupNormConfig(block=4096, num_warps=16, persistent=True),
                       "an input larger than L2: one persistent 16-warp program per SM keeps "
                       "only the groups in flight in L2, so the second walk reads them there"))
    return drafts


def _batch_norm_drafts(graph: SiteGraph) -> list[tuple[object, str]]:
    drafts: list[tuple[object, str]] = [
        (BatchNormConfig(), "channels split over about 4 programs per SM, 1024-element tiles")]
    if max(info.numel for info in graph.inputs) >= 1 << 22:
        drafts.append((BatchNormConfig(block=2048, num_warps=8),
                       "large batch: 2048-element tiles with 8 warps keep more bytes in flight"))
    return drafts


def _matmul_drafts(graph: SiteGraph) -> list[tuple[object, str]]:
    # The matmul's own output: a site may have a prologue, or return only its rows reduced.
    out = next(op.out for op in graph.ops if is_anchor(graph, op))
    drafts = [(MatmulConfig(), "128×128×32 tiles, GROUP_M 8, 3 stages: a balanced start")]
    if out.dtype == torch.float32:
        drafts.insert(0, (MatmulConfig(num_warps=8, precision="tf32x3"),
                          "fp32 as three tf32 tensor-core products each (fp32's accuracy at "
                          "several times the speed of fp32 arithmetic), 128×128×32 tiles"))
    if out.dtype in (torch.float16, torch.bfloat16):
        drafts.append((MatmulConfig(block_m=128, block_n=256, block_k=64, num_warps=8),
                       "half precision: 128×256×64 tiles with 8 warps feed the tensor cores"))
        # Few enough registers a thread with a GELU epilogue on sm_90 to leave room for a
        # fourth stage (bench/NOTES.md, 2026-12-03, reading sm_90 code on the CPU).
        drafts.append((MatmulConfig(block_m=128, block_n=128, block_k=64, num_warps=8,
                                    num_stages=4),
                       "half precision: 128×128×64 tiles, 8 warps, 4 stages: fewer registers "
                       "a thread, deeper pipelining"))
    if out.numel < 1 << 20:
        drafts.append((MatmulConfig(block_m=64, block_n=64, num_warps=4),
                       "small output: 64×64 tiles give every SM a program"))
    return drafts


def _pointwise_conv_drafts(graph: SiteGraph) -> list[tuple[object, str]]:
    """A convolution by a 1×1 kernel as the matmul it is, its epilogue on the tiles: fp32 in
    TF32, as cuDNN convolves fp32 by PyTorch's default; half precision as a matmul's."""
    if not graph.ops or not pointwise_conv(graph, graph.ops[0]):
        return []
    out = graph.ops[0].out
    if out.dtype != torch.float32:
        return [d for d in _matmul_drafts(graph) if d[0].precision == "ieee"]
    return [(MatmulConfig(num_warps=8, precision="tf32"),
             "a 1×1 convolution is a matmul: fp32 in TF32 as cuDNN's, 128×128×32 tiles, the "
             "epilogue on the tiles"),
            (MatmulConfig(block_m=64, block_n=128, num_warps=4, precision="tf32"),
             "64×128×32 tiles: twice the programs for short channel counts"),
            (MatmulConfig(num_warps=8, precision="tf32x3"),
             "fp32's accuracy as three TF32 products, for a norm after it that magnifies TF32's "
             "rounding")]


def _cuda_pointwise_drafts(graph: SiteGraph) -> list[tuple[object, str]]:
    return [(CudaPointwiseConfig(), "16-byte vector loads, grid-stride over 4 blocks per SM")]


def _cuda_row_drafts(graph: SiteGraph) -> list[tuple[object, str]]:
    row = graph.info(graph.outputs[0]).shape[-1] if graph.info(graph.outputs[0]).shape else 1
    if row <= 1024:
        return [(CudaReductionConfig(threads=256, rows_per_block=4),
                 f"short rows of {row}: 4 rows per block, warp-shuffle reductions")]
    return [(CudaReductionConfig(threads=512 if row > 4096 else 256),
             f"one row of {row} per block, warp shuffles then shared memory")]


def _cluster_norm_drafts(graph: SiteGraph) -> list[tuple[object, str]]:
    # On an H200, with the share in registers, group norm + silu 16×512×64² fp32 ran fastest
    # at 8 × 128 × 4 (64 values a thread) and batch norm 32×256×56² at 8 × 320 × 4 (40 a
    # thread), both ahead of every shared-memory setting (bench/NOTES.md, eighth round;
    # bench/results/rules_generator_h200.md, the ladders of 2026-12-04).
    drafts: list[tuple[object, str]] = []
    for cluster, most in ((8, 64), (8, 40), (4, 64)):
        try:
            threads = register_threads(graph, cluster, most)
        except Unsupported:
            break  # not a norm site: the writer says why
        if threads is None:
            continue
        config = ClusterNormConfig(cluster=cluster, threads=threads, vector=4, held="registers")
        if all(config != known for known, _ in drafts):
            drafts.append((config, f"each set of values read once into the registers of a "
                                   f"{cluster}-block cluster of {threads} threads, at most "
                                   f"{most} values a thread, every load of a share issued at "
                                   "once, the blocks' moments sent to each other"))
    if any(op.name == "batch_norm" for op in graph.ops):
        drafts.append((ClusterNormConfig(cluster=2, threads=1024, vector=4),
                       "each channel read once into the shared memory of a 2-block cluster "
                       "of 1024 threads moving 4 values a step: one block an SM"))
    return drafts + [
        (ClusterNormConfig(cluster=4, threads=512, vector=4),
         "each set of values read once into the shared memory of a 4-block cluster of 512 "
         "threads moving 4 values a step, the blocks' moments sent to each other"),
        (ClusterNormConfig(vector=4),
         "8-block clusters of 256 threads moving 4 values a step: half the shared memory a "
         "block"),
        (ClusterNormConfig(threads=512, vector=2),
         "8-block clusters of 512 threads moving 2 values a step: more of each share in flight "
         "at once"),
        (ClusterNormConfig(threads=512), "8-block clusters of 512 threads, a value a step: any "
                                         "strides")]


def _cuda_compiled_drafts(graph: SiteGraph) -> list[tuple[object, str]]:
    """The compiler's drafts, after the schedules only the CUDA tier has (rows kept in shared
    memory, rows shared by a cluster), where they apply; a reduction's walks in vectors of 4
    where they fit (the Triton tier's own drafts seed its search a column at a time)."""
    try:
        program = program_of(graph)
    except Unsupported:
        return list(compiled_drafts(graph))
    kernel = main_kernel(program)
    return [*cuda_drafts(kernel), *in_vectors(kernel, list(compiled_drafts(graph)))]


WRITERS = (
    Writer("reduction", "triton", write_group_norm, GroupNormConfig, _group_norm_drafts),
    Writer("reduction", "triton", write_batch_norm, BatchNormConfig, _batch_norm_drafts),
    Writer("pointwise", "triton", write_compiled, Schedule, compiled_drafts),
    Writer("reduction", "triton", write_compiled, Schedule, compiled_drafts),
    Writer("matmul", "triton", write_triton_matmul, MatmulConfig, _matmul_drafts),
    # A conv site's kernels: cuDNN's convolution, then what follows it (a depthwise one: all);
    # a 1×1 one, the matmul's kernel with all that follows it on the tiles.
    Writer("conv", "triton", write_compiled, Schedule, compiled_drafts),
    Writer("conv", "triton", write_triton_matmul, MatmulConfig, _pointwise_conv_drafts),
    Writer("attention", "triton", write_attention, AttentionConfig, attention_drafts),
    Writer("pointwise", "cuda", write_cuda_pointwise, CudaPointwiseConfig,
           _cuda_pointwise_drafts),
    Writer("reduction", "cuda", write_cuda_reduction, CudaReductionConfig, _cuda_row_drafts),
    Writer("reduction", "cuda", write_cuda_channel_norm, ClusterNormConfig,
           _cluster_norm_drafts),
    Writer("pointwise", "cuda", write_cuda_compiled, Schedule, compiled_drafts,
           follows="write_compiled"),
    Writer("reduction", "cuda", write_cuda_compiled, Schedule, _cuda_compiled_drafts,
           follows="write_compiled"),
    Writer("conv", "cuda", write_cuda_compiled, Schedule, _cuda_compiled_drafts,
           follows="write_compiled"),
)



TF32_WHY = ("fp32 products as one TF32 tensor-core product, as this run's baselines multiply "
            "(--allow-tf32)")


def with_tf32(writer: Writer, settings: object, why: str) -> list[tuple[Writer, object, str]]:
    """A draft, preceded by its plain-TF32 twin when it multiplies fp32 as three TF32 products."""
    if getattr(settings, "precision", None) != "tf32x3":
        return [(writer, settings, why)]
    return [(writer, replace(settings, precision="tf32"), TF32_WHY), (writer, settings, why)]


class RulesGenerator:
    name = "rules"

    def __init__(self, writers: tuple[Writer, ...] = WRITERS, allow_tf32: bool = False) -> None:
        """`allow_tf32`: the run lets fp32 matmuls multiply as TF32 (`--allow-tf32`), so fp32
        dots are drafted and mutated to plain TF32 too."""
        self.writers = writers
        self.allow_tf32 = allow_tf32
        self._graphs: dict[Path, SiteGraph | Unsupported] = {}
        self._seen: dict[Path, set[str]] = {}

    def graph(self, problem: Path) -> SiteGraph:
        problem = problem.resolve()
        if problem not in self._graphs:
            try:
                self._graphs[problem] = load_site_graph(problem)
            except Unsupported as reason:
                self._graphs[problem] = reason
        found = self._graphs[problem]
        if isinstance(found, Unsupported):
            raise found
        return found

    def remember(self, problem: Path, source: str) -> None:
        """A source proposed before (in an earlier, interrupted run): never propose it again."""
        self._seen.setdefault(problem.resolve(), set()).add(source_digest(source))

    def _seeds(self, graph: SiteGraph, parent: Parent | None, writers: list[Writer]
               ) -> list[tuple[Writer, object, str]]:
        """The writers' drafts, each writer's in turn (its first, then the next writer's first,
        ...: a writer with many drafts does not use up a short search before another's first is
        judged), after the parent's settings written by a writer that follows its writer (a
        compiled Triton kernel's schedule, in CUDA)."""
        own = [[(w, s, why) for s, why in w.drafts(graph)] for w in writers]
        candidates = [c for turn in itertools.zip_longest(*own) for c in turn if c is not None]
        if parent is not None:
            candidates = [(w, s, "the parent's settings, written in this tier")
                          for w in writers
                          if (s := w.carried(parent.proposal)) is not None] + candidates
        if self.allow_tf32:
            candidates = [twin for c in candidates for twin in with_tf32(*c)]
        return candidates

    def propose(self, problem: Path, parent: Parent | None, n: int,
                tiers: tuple[str, ...] = ("triton",)) -> Proposals:
        try:
            graph = self.graph(problem)
        except Unsupported as reason:
            return Proposals([], declined=str(reason))
        writers = [w for w in self.writers if w.family == graph.family and w.tier in tiers]
        if not writers:
            return Proposals([], declined=f"no {'/'.join(tiers)} rules for {graph.family} sites")
        seen = self._seen.setdefault(problem.resolve(), set())
        candidates: list[tuple[Writer, object, str]] = []
        owned = [] if parent is None else [
            (w, s) for w in writers if (s := w.settings_of(parent.proposal)) is not None]
        if owned:
            writer, settings = owned[0]
            diagnosis = parent.feedback.diagnosis if parent and parent.feedback else ""
            candidates = [(writer, step.settings, step.rationale)
                          for step in diagnosed_neighbours(settings, diagnosis)]
            if self.allow_tf32 and getattr(settings, "precision", "tf32") != "tf32":
                candidates.insert(0, (writer, replace(settings, precision="tf32"), TF32_WHY))
            # A tier opened after the parent's (CUDA beside Triton): its seeds and drafts first,
            # hung under this kernel, then the parent's own neighbours.
            others = [w for w in writers if w.tier != writer.tier]
            candidates = self._seeds(graph, parent, others) + candidates
        else:
            # No parent, or one from another tier or generator (a Triton kernel seeding the
            # CUDA tier): this tier's drafts, which the search hangs under that parent.
            candidates = self._seeds(graph, parent, writers)
        children: list[Proposal] = []
        reasons: dict[str, None] = {}  # each writer's reason once, in the writers' order
        repeated = False  # a child written before was skipped
        for writer, settings, why in candidates:
            if len(children) == n:
                break
            try:
                source = writer.write(graph, settings)
            except Unsupported as reason:
                reasons[str(reason)] = None
                continue
            digest = source_digest(source)
            if digest in seen:
                repeated = True
                continue
            seen.add(digest)
            children.append(Proposal(source, writer.tier, self.name, why,
                                     {"writer": writer.write.__name__, **asdict(settings)}))
        if repeated:
            reasons["every other child it could write was a duplicate"] = None
        declined = "" if children else ("; ".join(reasons) or "every child was a duplicate")
        return Proposals(children, declined)

