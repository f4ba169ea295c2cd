"""Sites: the model's regions, grouped by identity, each written as a runnable site problem.

Identical regions (the same ops on the same layouts, wherever they sit in the model) are one
site with many call sites. Each site's folder holds `problem.py` and, when the captured
tensors are small enough, `inputs.pt` with the real inputs of its first call site; past the
limit, `site.json` still records their shapes and value statistics.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.fx as fx

from core.profile.roofline import Cost, GpuPeaks, region_cost
from core.runtime.capture import Capture, CapturedGraph, record_values
from core.runtime.problem_loader import CAPTURED_INPUTS_FILE, storage_span, with_layout
from core.runtime.regions import Region
from core.runtime.site_problem import CodegenError, SiteProblem, write_problem


@dataclass(eq=False)
class CallSite:
    graph: CapturedGraph
    region: Region


@dataclass(eq=False)
class Site:
    problem: SiteProblem
    cost: Cost
    call_sites: list[CallSite] = field(default_factory=list)
    example_inputs: list[torch.Tensor] = field(default_factory=list)
    example_outputs: list[object] = field(default_factory=list)
    time_ms: float = 0.0  # in situ, all call sites, per forward
    folder: Path | None = None

    @property
    def key(self) -> str:
        return self.problem.key

    @property
    def family(self) -> str:
        return self.problem.family

    @property
    def calls(self) -> int:
        return sum(cs.graph.calls for cs in self.call_sites)

    @property
    def floor_ms(self) -> float:
        return self.cost.floor_ms * self.calls


@dataclass
class SiteTable:
    sites: list[Site]
    site_of: dict[Region, Site]
    unwritable: list[tuple[Region, str]]  # regions kept with PyTorch, and why


def find_sites(capture: Capture, peaks: GpuPeaks, allow_tf32: bool = False) -> SiteTable:
    sites: dict[str, Site] = {}
    site_of: dict[Region, Site] = {}
    unwritable: list[tuple[Region, str]] = []
    for graph in capture.graphs:
        if graph.calls == 0:
            continue  # compiled for a path the counted forward no longer takes
        wanted: set[fx.Node] = set()
        for region in graph.regions:
            wanted.update(region.inputs, region.outputs)
        values = record_values(graph, wanted)
        # A copy of the graph's inputs (the model's own, for a model of one graph): held, it
        # would keep their size of the GPU for the whole run.
        graph.first_inputs = None
        for region in graph.regions:
            try:
                problem = write_problem(region, values)
            except CodegenError as err:
                unwritable.append((region, str(err)))
                continue
            site = sites.get(problem.key)
            if site is None:
                site = Site(problem, region_cost(region, peaks, allow_tf32))
                site.example_inputs = [values[n] for n in region.inputs]
                site.example_outputs = [values[n] for n in region.outputs]
                sites[problem.key] = site
            site.call_sites.append(CallSite(graph, region))
            site_of[region] = site
    return SiteTable(list(sites.values()), site_of, unwritable)


def write_site_folder(site: Site, root: Path, max_input_bytes: int) -> Path:
    folder = root / site.key
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "problem.py").write_text(site.problem.source)
    size = sum(storage_span(t)[1] for t in site.example_inputs)
    saved = size <= max_input_bytes
    if saved:
        torch.save([with_layout(t) for t in site.example_inputs], folder / CAPTURED_INPUTS_FILE)
    else:
        (folder / CAPTURED_INPUTS_FILE).unlink(missing_ok=True)
    meta = {
        "key": site.key,
        "family": site.family,
        "signature": site.problem.signature,
        "ops": list(site.problem.ops),
        "calls": site.calls,
        "call_sites": [
            {"graph": cs.graph.index, "nodes": [n.name for n in cs.region.nodes],
             "inputs": [n.name for n in cs.region.inputs]}
            for cs in site.call_sites
        ],
        "inputs_saved": saved,
        "input_bytes": size,
        "inputs": [
            {"shape": list(s.shape), "stride": list(s.stride), "dtype": str(s.dtype),
             "mean": s.mean, "std": s.std, "min": s.low, "max": s.high}
            for s in site.problem.inputs
        ],
        "bytes": site.cost.bytes,
        "matrix_flops": site.cost.matrix_flops,
        "vector_flops": site.cost.vector_flops,
    }
    (folder / "site.json").write_text(json.dumps(meta, indent=2))
    site.folder = folder
    return folder
