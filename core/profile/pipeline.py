"""Profiling a model into a site table: load, capture, cut into sites, time, write problems."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from core.profile.in_situ import ProfileConfig, profile_model, steady_threads
from core.profile.load import BuiltinShape, LoadedModel, check_runs, load_model, resolve_device
from core.profile.progress import Progress
from core.profile.roofline import GpuPeaks
from core.profile.site_table import ranked, site_report
from core.profile.sites import SiteTable, find_sites, write_site_folder
from core.runtime.capture import capture
from core.timing.precision import fp32_matmuls


@dataclass(frozen=True)
class ListSitesConfig:
    model: str
    device: str
    dtype: str | None = None
    seed: int = 0
    out: Path = Path("kiln-out")
    shape: BuiltinShape = BuiltinShape()
    profile: ProfileConfig = ProfileConfig()
    peaks: GpuPeaks = GpuPeaks()
    max_input_bytes: int = 256 * 2**20
    quiet: bool = False
    allow_tf32: bool = False  # fp32 matmuls on TF32 tensor cores (`core.timing.precision`)


@dataclass
class ProfiledModel:
    """A loaded model cut into sites, profiled, with its site problems written."""

    loaded: LoadedModel
    table: SiteTable
    report: dict[str, object]


def profile_sites(config: ListSitesConfig) -> ProfiledModel:
    """Load, capture, cut into sites, profile and write the site problems."""
    device = resolve_device(config.device)
    with steady_threads(device), fp32_matmuls(config.allow_tf32):
        return _profile_sites(config, device)


def _profile_sites(config: ListSitesConfig, device: torch.device) -> ProfiledModel:
    progress = Progress(enabled=not config.quiet)
    progress.step(f"loading {config.model}")
    loaded = load_model(config.model, device, config.dtype, config.seed, config.shape)
    check_runs(loaded, config.dtype)
    progress.step("capturing graphs through torch.compile")
    captured = capture(loaded.model, loaded.inputs, device)
    table = find_sites(captured, config.peaks, config.allow_tf32)
    progress.step(f"{len(captured.graphs)} graph(s), {len(table.sites)} site(s); profiling")
    profile = profile_model(loaded, captured, table, config.profile,
                            progress.bar("profiling forwards"))
    folder = config.out / loaded.name / "sites"
    for site in ranked(table):
        write_site_folder(site, folder, config.max_input_bytes)
        # Written, the captured values are not read again; held, a large model's would keep
        # its outputs' size of the GPU for the whole run.
        site.example_inputs, site.example_outputs = [], []
    progress.step(f"site problems written under {folder}")
    dtype = config.dtype or str(next(loaded.model.parameters(), torch.empty(0)).dtype)
    report = site_report(config.model, dtype, device.type, profile, table,
                         len(captured.graphs), config.peaks.name)
    return ProfiledModel(loaded, table, report)


def list_sites(config: ListSitesConfig) -> dict[str, object]:
    """Everything `--list-sites` does; returns the JSON report."""
    return profile_sites(config).report
