"""After an optimize run: each searched site's best kernel, and the end-to-end result."""

from __future__ import annotations

import sys
from pathlib import Path

from core.optimize.e2e import (
    INDICATIVE,
    NOTHING_INSTALLED,
    correctness_text,
    floor_text,
    rounds_text,
)
from generators.compiler.site import declined


def _ms(value: float | None) -> str:
    return "-" if value is None or value == float("inf") else f"{value:.4f}"


def print_search_table(report: dict, out=sys.stdout) -> None:
    """Each searched site's best kernel after an optimize run, and the end-to-end result."""
    print(f"\nrun {report['run_id']} in {report['db']}: best kernel per searched site "
          "(speedup against the faster of eager and torch.compile)", file=out)
    print(f"{'site':<28} {'evals':>5} {'eager ms':>9} {'compile ms':>10} {'tier':>7} "
          f"{'best ms':>9} {'speedup':>8}  note", file=out)
    for site in report["searched"]:
        best = site["best"]
        print(f"{site['id']:<28} {site['evaluations']:>5} {_ms(site.get('eager_ms')):>9} "
              f"{_ms(site.get('compile_ms')):>10} {best['tier']:>7} {_ms(best['latency_ms']):>9} "
              f"{best['speedup']:8.2f}  {site['declined']}", file=out)
    e2e = report.get("e2e")
    if e2e:
        print_end_to_end(e2e, out)


def print_end_to_end(e2e: dict, out=sys.stdout) -> None:
    if e2e.get("error"):
        print(f"\nend to end: not done: {e2e['error']}", file=out)
        return
    cpu = e2e["timing"] == "cpu"
    timing = INDICATIVE if cpu else "GPU timing"
    floor = floor_text(e2e)
    if not e2e["installed"]:
        print(f"\nend to end ({timing})\n{NOTHING_INSTALLED} (eager {e2e['eager_ms']:.4f} ms, "
              f"torch.compile {e2e['compile_ms']:.4f} ms{floor})", file=out)
    else:
        verdict = correctness_text(e2e, wrong="WRONG")
        print(f"\nend to end ({timing}{rounds_text(e2e)}{floor}): the model with "
              f"{len(e2e['installed'])} kernel(s) installed, the rest {e2e['rest']}: {verdict}",
              file=out)
        header = f"{'eager ms':>10} {'compile ms':>11} {'Kiln ms':>10}"
        row = f"{e2e['eager_ms']:10.4f} {e2e['compile_ms']:11.4f} {e2e['optimized_ms']:10.4f}"
        if not cpu:
            header += f" {'vs eager':>9} {'vs compile':>11} {'predicted':>10}"
            row += (f" {e2e['speedup_vs_eager']:8.2f}x {e2e['speedup_vs_compile']:10.2f}x "
                    f"{e2e['predicted_speedup']:9.2f}x")
        print(header, file=out)
        print(row, file=out)
    for key, why in e2e["removed"].items():
        print(f"  {key} taken out: {why}", file=out)


COMPILED_FAMILIES = ("pointwise", "reduction")


def note_declines(report: dict) -> dict:
    """Each pointwise and reduction site of a site report with why the kernel compiler cannot
    plan it (`declined`, naming the op that stopped it), or None where it can."""
    for site in report["sites"]:
        if site["family"] in COMPILED_FAMILIES and site.get("problem"):
            site["declined"] = declined(Path(site["problem"]))
    return report
