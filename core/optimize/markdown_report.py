"""The optimize run's report as a Markdown file: sites, winners, and the end-to-end result."""

from __future__ import annotations

from pathlib import Path

from core.optimize.e2e import (
    INDICATIVE,
    NOTHING_INSTALLED,
    correctness_text,
    floor_text,
    rounds_text,
)


def _ms(value: float | None) -> str:
    return "-" if value is None or value == float("inf") else f"{value:.4f}"


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    return lines + ["| " + " | ".join(row) + " |" for row in rows]


def _end_to_end(e2e: dict) -> list[str]:
    if e2e.get("error"):
        return ["## End to end", "", f"Not done: {e2e['error']}.", ""]
    cpu = e2e["timing"] == "cpu"
    timing = INDICATIVE if cpu else "GPU timing"
    floor = floor_text(e2e)
    if not e2e["installed"]:
        lines = ["## End to end", "",
                 f"{NOTHING_INSTALLED}. Timed for reference "
                 f"({timing}): eager {e2e['eager_ms']:.4f} ms, torch.compile "
                 f"{e2e['compile_ms']:.4f} ms{floor}.", ""]
    else:
        verdict = correctness_text(e2e, wrong="**wrong**")
        header = ["eager ms", "torch.compile ms", "Kiln ms"]
        row = [f"{e2e['eager_ms']:.4f}", f"{e2e['compile_ms']:.4f}", f"{e2e['optimized_ms']:.4f}"]
        if not cpu:
            header += ["vs eager", "vs torch.compile", "predicted (Amdahl) vs eager"]
            row += [f"{e2e['speedup_vs_eager']:.2f}x", f"{e2e['speedup_vs_compile']:.2f}x",
                    f"{e2e['predicted_speedup']:.2f}x"]
        lines = ["## End to end", "",
                 f"{len(e2e['installed'])} kernel(s) installed, every other op run by "
                 f"{e2e['rest']}; {verdict}. Timing: {timing}{rounds_text(e2e)}{floor}.", "",
                 *_table(header, [row])]
    if e2e["removed"]:
        lines += ["", "Kernels taken out:", ""]
        lines += [f"- `{key}`: {why}" for key, why in e2e["removed"].items()]
    if e2e.get("untraceable"):
        lines += ["", "Kernels called through their custom op (inductor could not trace "
                  "them):", ""]
        lines += [f"- `{key}`: {why}" for key, why in e2e["untraceable"].items()]
    return [*lines, ""]


def precision_line(allow_tf32: bool) -> str:
    if allow_tf32:
        return ("fp32 matmuls ran as TF32 (--allow-tf32), in the baselines as in the kernels, "
                "which were held to TF32's tolerance.")
    return ("fp32 matmuls stayed fp32, in the baselines as in the kernels (pass --allow-tf32 to "
            "let both use TF32); convolutions ran as cuDNN runs them by default, TF32.")


def markdown_report(report: dict) -> str:
    timing = report["timing"]
    lines = [f"# Kiln: {report['model']}", "",
             f"Run {report['run_id']} in `{report['db']}`; dtype {report['dtype']}, device "
             f"{report['device']}, timing: {timing}. Model time {report['total_ms']:.3f} ms eager, "
             f"{report['captured_ms']:.3f} ms as captured; floors against {report['floor_gpu']}.",
             "", precision_line(report.get("allow_tf32", False)), ""]
    if report["device"] == "cpu":
        lines += [f"{INDICATIVE}.", ""]
    if report.get("failure"):
        lines += [f"**The run failed** {report['failure']}; what it judged until then is below "
                  "and in the store.", ""]
    if report.get("e2e"):
        lines += _end_to_end(report["e2e"])
    lines += ["## Searched sites", "",
              "Speedup against the faster of the site's eager and torch.compile times.", ""]
    lines += _table(
        ["site", "evaluations", "eager ms", "compile ms", "winner", "best ms", "speedup",
         "note"],
        [[f"`{s['id']}`", str(s["evaluations"]), _ms(s.get("eager_ms")),
          _ms(s.get("compile_ms")), s["best"]["tier"], _ms(s["best"]["latency_ms"]),
          f"{s['best']['speedup']:.2f}x", s["declined"]] for s in report["searched"]])
    lines += ["", "## All sites", ""]
    lines += _table(
        ["site", "family", "share", "time ms", "floor ms", "calls", "signature"],
        [[f"`{s['id']}`", s["family"], f"{s['share']:.1%}", f"{s['time_ms']:.4f}",
          f"{s['floor_ms']:.4f}", str(s["calls"]), s["signature"].replace("|", "\\|")]
         for s in report["sites"]])
    return "\n".join(lines) + "\n"


def write_markdown_report(report: dict, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(markdown_report(report))
    return path
