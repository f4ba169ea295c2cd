"""`python -m core.optimize MODEL`: load, capture, cut into sites, profile, report."""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path

import torch

from core.capture import capture
from core.errors import KilnInputError, exit_on_input_error
from core.load import DTYPES, BuiltinShape, check_runs, load_model, resolve_device
from core.profile import ProfileConfig, profile_model
from core.progress import Progress
from core.report import print_site_table, ranked, site_report
from core.roofline import GpuPeaks
from core.sites import find_sites, write_site_folder


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


def list_sites(config: ListSitesConfig) -> dict[str, object]:
    """Everything `--list-sites` does; returns the JSON report."""
    progress = Progress(enabled=not config.quiet)
    device = resolve_device(config.device)
    progress.step(f"loading {config.model}")
    loaded = load_model(config.model, device, config.dtype, config.seed, config.shape)
    check_runs(loaded, config.dtype)
    progress.step("capturing graphs through torch.compile")
    captured = capture(loaded.model, loaded.inputs, device)
    table = find_sites(captured, config.peaks)
    progress.step(f"{len(captured.graphs)} graph(s), {len(table.sites)} site(s); profiling")
    profile = profile_model(loaded, captured, table, config.profile,
                            progress.bar("profiling forwards"))
    folder = config.out / loaded.name / "sites"
    for site in ranked(table):
        write_site_folder(site, folder, config.max_input_bytes)
    progress.step(f"site problems written under {folder}")
    dtype = config.dtype or str(next(loaded.model.parameters(), torch.empty(0)).dtype)
    return site_report(config.model, dtype, device.type, profile, table,
                       len(captured.graphs), config.peaks.name)


def _parse(argv: list[str] | None) -> tuple[argparse.Namespace, ListSitesConfig]:
    parser = argparse.ArgumentParser(prog="python -m core.optimize", description=__doc__)
    parser.add_argument("model", help="KernelBench .py file, package.module:callable, "
                        "torchvision:<name> or hf:<model_type>[?key=value&...]")
    parser.add_argument("--list-sites", action="store_true",
                        help="stop after profiling and print the ranked site table")
    parser.add_argument("--device", choices=["cuda", "cpu"],
                        default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", choices=list(DTYPES), help="cast model and inputs")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    parser.add_argument("--out", type=Path, default=Path("kiln-out"),
                        help="where site problems are written (default: kiln-out)")
    parser.add_argument("--batch", type=int, default=1, help="batch size of built-in models")
    parser.add_argument("--seq-len", type=int, default=128, help="sequence length (hf: text)")
    parser.add_argument("--image-size", type=int, default=224, help="image size (vision)")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--trials", type=int, default=20, help="timed forwards (median)")
    parser.add_argument("--max-input-mb", type=float, default=256,
                        help="save a site's captured inputs up to this size")
    parser.add_argument("--bandwidth", type=float, default=4.3,
                        help="GPU memory bandwidth for floors, TB/s (default: H200)")
    parser.add_argument("--matrix-tflops", type=float,
                        help="matrix peak for the model's dtype, TFLOP/s (default: H200)")
    args = parser.parse_args(argv)
    if args.trials < 1 or args.warmup < 0 or args.batch < 1 or args.seq_len < 1:
        raise KilnInputError("--trials, --batch and --seq-len must be positive, --warmup >= 0",
                             "pass positive counts")
    peaks = GpuPeaks()
    if args.bandwidth != 4.3 or args.matrix_tflops:
        matrix = dict(peaks.matrix_flops)
        if args.matrix_tflops:
            matrix[args.dtype or "fp32"] = args.matrix_tflops * 1e12
        peaks = GpuPeaks("custom GPU", args.bandwidth * 1e12, matrix, peaks.vector_flops)
    config = ListSitesConfig(
        model=args.model, device=args.device, dtype=args.dtype, seed=args.seed, out=args.out,
        shape=BuiltinShape(args.batch, args.seq_len, args.image_size),
        profile=ProfileConfig(args.warmup, args.trials), peaks=peaks,
        max_input_bytes=int(args.max_input_mb * 2**20), quiet=False,
    )
    return args, config


def main(argv: list[str] | None = None) -> int:
    args, config = _parse(argv)
    if not args.list_sites:
        raise KilnInputError("this version of Kiln profiles models but does not search yet",
                             "add --list-sites")
    report = list_sites(config)
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print_site_table(report)
    return 0


if __name__ == "__main__":
    exit_on_input_error(main)
