"""The offline rules generator: kernels written from the site's graph, no LLM, no network.

Drafts (no parent, or a parent from another tier) are each applicable writer at its default
settings and a size-based variant; children of one of its own kernels move one knob of its
settings one step (`mutations`). Sources
already proposed for the site are skipped, so every child is distinct.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from generators.base import Parent, Proposal, Proposals, source_digest
from generators.cuda_pointwise import CudaPointwiseConfig, write_cuda_pointwise
from generators.cuda_reduction import CudaReductionConfig, write_cuda_reduction
from generators.mutations import neighbours
from generators.site_graph import SiteGraph, Unsupported, load_site_graph
from generators.triton_conv import write_conv_epilogue
from generators.triton_dim_reduction import DimConfig, write_dim_reduction
from generators.triton_matmul import MatmulConfig, write_triton_matmul
from generators.triton_pointwise import PointwiseConfig, write_pointwise
from generators.triton_reduction import RowConfig, write_row_reduction


@dataclass(frozen=True)
class Writer:
    family: str
    tier: str
    write: Callable[[SiteGraph, object], str]
    settings_type: type
    drafts: Callable[[SiteGraph], list[tuple[object, str]]]  # settings and why

    def settings_of(self, proposal: Proposal) -> object | None:
        """The settings a proposal of this writer was made with, or None if not its own."""
        if proposal.settings.get("writer") != self.write.__name__:
            return None
        return self.settings_type(**{k: v for k, v in proposal.settings.items()
                                     if k != "writer"})


def _pointwise_drafts(graph: SiteGraph) -> list[tuple[object, str]]:
    numel = graph.info(graph.outputs[0]).numel
    drafts = [(PointwiseConfig(), "one pass, BLOCK 1024 elements per program")]
    if numel >= 1 << 22:
        drafts.append((PointwiseConfig(block=4096, num_warps=8),
                       "large tensor: BLOCK 4096 with 8 warps keeps more bytes in flight"))
    return drafts


def _row_drafts(graph: SiteGraph) -> list[tuple[object, str]]:
    row = max(graph.info(r).shape[-1] if graph.info(r).shape else 1 for r in graph.outputs)
    warps = 4 if row <= 2048 else 8 if row <= 8192 else 16
    return [(RowConfig(num_warps=warps), f"one row of {row} per program, {warps} warps")]


def _matmul_drafts(graph: SiteGraph) -> list[tuple[object, str]]:
    out = graph.info(graph.outputs[0])
    drafts = [(MatmulConfig(), "128×128×32 tiles, GROUP_M 8, 3 stages: a balanced start")]
    if out.dtype in (torch.float16, torch.bfloat16):
        drafts.append((MatmulConfig(block_m=128, block_n=256, block_k=64, num_warps=8),
                       "half precision: 128×256×64 tiles with 8 warps feed the tensor cores"))
    if out.numel < 1 << 20:
        drafts.append((MatmulConfig(block_m=64, block_n=64, num_warps=4),
                       "small output: 64×64 tiles give every SM a program"))
    return drafts


def _dim_drafts(graph: SiteGraph) -> list[tuple[object, str]]:
    return [(DimConfig(), "16 reduced rows × 128 inner columns per step, coalesced on the inner"),
            (DimConfig(block_r=32, block_i=256, num_warps=8),
             "larger tiles: more bytes in flight per program")]


def _cuda_pointwise_drafts(graph: SiteGraph) -> list[tuple[object, str]]:
    return [(CudaPointwiseConfig(), "16-byte vector loads, grid-stride over 4 blocks per SM")]


def _cuda_row_drafts(graph: SiteGraph) -> list[tuple[object, str]]:
    row = graph.info(graph.outputs[0]).shape[-1] if graph.info(graph.outputs[0]).shape else 1
    if row <= 1024:
        return [(CudaReductionConfig(threads=256, rows_per_block=4),
                 f"short rows of {row}: 4 rows per block, warp-shuffle reductions")]
    return [(CudaReductionConfig(threads=512 if row > 4096 else 256),
             f"one row of {row} per block, warp shuffles then shared memory")]


WRITERS = (
    Writer("pointwise", "triton", write_pointwise, PointwiseConfig, _pointwise_drafts),
    Writer("reduction", "triton", write_row_reduction, RowConfig, _row_drafts),
    Writer("reduction", "triton", write_dim_reduction, DimConfig, _dim_drafts),
    Writer("matmul", "triton", write_triton_matmul, MatmulConfig, _matmul_drafts),
    Writer("conv", "triton", write_conv_epilogue, PointwiseConfig, _pointwise_drafts),
    Writer("pointwise", "cuda", write_cuda_pointwise, CudaPointwiseConfig,
           _cuda_pointwise_drafts),
    Writer("reduction", "cuda", write_cuda_reduction, CudaReductionConfig, _cuda_row_drafts),
)



class RulesGenerator:
    name = "rules"

    def __init__(self, writers: tuple[Writer, ...] = WRITERS) -> None:
        self.writers = writers
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
            candidates = [(writer, step.settings, step.rationale)
                          for step in neighbours(settings)]
        else:
            # No parent, or one from another tier or generator (a Triton kernel seeding the
            # CUDA tier): this tier's drafts, which the search hangs under that parent.
            candidates = [(w, s, why) for w in writers for s, why in w.drafts(graph)]
        children: list[Proposal] = []
        reasons: list[str] = []
        for writer, settings, why in candidates:
            if len(children) == n:
                break
            try:
                source = writer.write(graph, settings)
            except Unsupported as reason:
                reasons.append(str(reason))
                continue
            digest = source_digest(source)
            if digest in seen:
                continue
            seen.add(digest)
            children.append(Proposal(source, writer.tier, self.name, why,
                                     {"writer": writer.write.__name__, **asdict(settings)}))
        declined = "" if children else (reasons[0] if reasons else "every child was a duplicate")
        return Proposals(children, declined)

