"""The site table, as text for people and as JSON for programs."""

from __future__ import annotations

import sys

from core.profile.in_situ import Profile
from core.profile.sites import Site, SiteTable


def site_record(site: Site, program_ms: float) -> dict[str, object]:
    """One site; its share is of the captured program's time, where it was measured."""
    return {
        "id": site.key,
        "family": site.family,
        "signature": site.problem.signature,
        "ops": list(site.problem.ops),
        "calls": site.calls,
        "share": site.time_ms / program_ms if program_ms > 0 else 0.0,
        "time_ms": site.time_ms,
        "floor_ms": site.floor_ms,
        "bytes": site.cost.bytes * site.calls,
        "flops": (site.cost.matrix_flops + site.cost.vector_flops) * site.calls,
        "problem": str(site.folder / "problem.py") if site.folder else None,
    }


def ranked(table: SiteTable) -> list[Site]:
    return sorted(table.sites, key=lambda s: (-s.time_ms, s.key))


def site_report(model: str, dtype: str, device: str, profile: Profile, table: SiteTable,
                graphs: int, floor_gpu: str) -> dict[str, object]:
    captured = profile.captured.median_ms
    # Shares are of the captured program; where noise makes the sites and kept ops add up to
    # more than it (CPU timings under load), of their sum, so that shares stay fractions.
    whole = max(captured, profile.accounted_ms)
    return {
        "model": model,
        "dtype": dtype,
        "device": device,
        "timing": profile.device_label,
        "floor_gpu": floor_gpu,
        "total_ms": profile.total_ms,
        "latency_ms": profile.latency.median_ms,
        "captured_ms": captured,
        "instrumented_ms": profile.instrumented_ms,
        "mark_ms": profile.mark_ms,
        "kept_ms": profile.kept_ms,
        "outside_ms": profile.outside_ms,
        "accounted_ms": profile.accounted_ms,
        "floor_ms": sum(s.floor_ms for s in table.sites),  # the model's: its sites' summed
        "graphs": graphs,
        "sites": [site_record(s, whole) for s in ranked(table)],
        "kept_regions": [
            {"nodes": [n.name for n in region.nodes], "reason": reason}
            for region, reason in table.unwritable
        ],
    }


def print_site_table(report: dict, out=sys.stdout) -> None:
    total, captured = report["total_ms"], report["captured_ms"]
    print(f"model {report['model']}  dtype {report['dtype']}  device {report['device']}  "
          f"timing: {report['timing']}", file=out)
    print(f"model time {total:.3f} ms eager ({report['latency_ms']:.3f} ms latency with launches), "
          f"{captured:.3f} ms as captured in {report['graphs']} graph(s); medians; "
          f"floors against {report['floor_gpu']}", file=out)
    header = f"{'#':>3} {'share':>6} {'time ms':>9} {'floor ms':>9} {'family':<10} {'calls':>5}  "
    print(header + "id / signature", file=out)
    for rank, site in enumerate(report["sites"], 1):
        print(f"{rank:>3} {site['share'] * 100:5.1f}% {site['time_ms']:9.3f} "
              f"{site['floor_ms']:9.4f} {site['family']:<10} {site['calls']:>5}  "
              f"{site['id']}  {_shorten(site['signature'], 70)}", file=out)
        if site.get("declined"):
            print(f"{'':>48}no kernel: {_shorten(site['declined'], 100)}", file=out)
    kept = report["kept_ms"] + report["outside_ms"]
    print(f"    {_percent(kept, captured):>6} {kept:9.3f}  kept with PyTorch "
          f"(views and glue inside graphs {report['kept_ms']:.3f} ms, "
          f"between graphs {report['outside_ms']:.3f} ms)", file=out)
    accounted = report["accounted_ms"]
    print(f"sites + kept = {accounted:.3f} ms: {_percent(accounted, captured)} of the captured "
          f"program, {_percent(accounted, total)} of eager", file=out)
    floor = report["floor_ms"]
    # CPU times say nothing of how near a GPU would run to its floor.
    near = ("" if report["device"] == "cpu" else
            f": the captured program runs at {_percent(floor, captured)} of it")
    print(f"floor {floor:.4f} ms, the sites' roofline floors summed{near}", file=out)


def _percent(part: float, whole: float) -> str:
    return f"{part / whole * 100:.1f}%" if whole > 0 else "-"


def _shorten(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"
