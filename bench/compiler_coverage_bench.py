"""Which sites of the KernelBench development set the kernel compiler covers, and how well.

    python -m bench.compiler_coverage_bench [PROBLEM ...] [--device cuda|cpu] [--shrink]
                                            [--out DIR]

Each problem (default: every file of bench/kernelbench_dev) is profiled as `--list-sites`
profiles it; for each pointwise, reduction and conv site (cuDNN's convolution, then the rest),
the compiler either declines (the table says why, naming the op) or writes its first draft,
which the evaluator judges: correct or not, and on a GPU its time against the site's eager
PyTorch. `--shrink` first makes every module-level size
of a problem small (for the CPU, where Triton runs under its interpreter): the sites keep their
ops, not their sizes. The table is printed and written to DIR/compiler_coverage.md.
"""

from __future__ import annotations

import argparse
import ast
import sys
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from core.evaluate import EvalConfig, Evaluator  # noqa: E402
from core.profile.in_situ import ProfileConfig  # noqa: E402
from core.profile.pipeline import ListSitesConfig, list_sites  # noqa: E402
from generators.compiler.site import declined  # noqa: E402
from generators.rules import RulesGenerator  # noqa: E402

DEV = Path(__file__).resolve().parent / "kernelbench_dev"
FAMILIES = ("pointwise", "reduction", "conv")


@dataclass
class Row:
    problem: str
    site: str
    family: str
    signature: str
    outcome: str  # "correct", "wrong: ...", "declined: ...", "no draft: ..."
    speedup: float | None = None


def _constant_int(node: ast.expr) -> int | None:
    """The value of an int literal or of arithmetic on int literals (`256 * 8`), else None."""
    if isinstance(node, ast.Constant):
        return node.value if type(node.value) is int else None
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        value = _constant_int(node.operand)
        return None if value is None else -value
    operators = {ast.Add: int.__add__, ast.Sub: int.__sub__, ast.Mult: int.__mul__,
                 ast.FloorDiv: int.__floordiv__, ast.Pow: int.__pow__}
    if isinstance(node, ast.BinOp) and type(node.op) in operators:
        left, right = _constant_int(node.left), _constant_int(node.right)
        if left is None or right is None:
            return None
        return operators[type(node.op)](left, right)
    return None


SHRUNK_LARGEST = 32


def shrink(size: int, factor: int) -> int:
    """`size` divided by the problem's `factor`, but not under 16 (nor under itself when it is
    16 or less), and odd when it was, to keep ragged tails."""
    if size <= 16:
        return size
    small = max(16, size // factor)
    return small + 1 if size % 2 and small % 2 == 0 else small


def shrunk(source: str) -> str:
    """Module-level int sizes (literals or arithmetic on them) divided by one factor that brings
    the largest to SHRUNK_LARGEST, none under 16: sizes keep their ratios where they can, so
    that channels still split into groups of several values (each made 16 alone, 8192 channels
    in 512 groups became groups of one value, whose normalized output is rounding noise)."""
    lines = source.splitlines()
    assigned = []
    for node in ast.parse(source).body:
        # `n = 4`, `h = w = 256`, `shape = (4, 8)` and `D, H, W = 16, 32, 32` alike.
        if not (isinstance(node, ast.Assign) and node.lineno == node.end_lineno and all(
                isinstance(t, ast.Name) or (isinstance(t, ast.Tuple) and all(
                    isinstance(e, ast.Name) for e in t.elts)) for t in node.targets)):
            continue
        values = node.value.elts if isinstance(node.value, ast.Tuple) else [node.value]
        sizes = [_constant_int(v) for v in values]
        if all(size is not None for size in sizes):
            assigned.append((node, sizes))
    largest = max((size for _, sizes in assigned for size in sizes), default=0)
    factor = max(1, largest // SHRUNK_LARGEST)
    for node, sizes in assigned:
        small = [str(shrink(size, factor)) for size in sizes]
        targets = " = ".join(", ".join(e.id for e in t.elts) if isinstance(t, ast.Tuple)
                             else t.id for t in node.targets)
        if isinstance(node.value, ast.Tuple):
            value = ", ".join(small) if len(node.targets) == 1 and isinstance(
                node.targets[0], ast.Tuple) else f"({', '.join(small)},)"
        else:
            value = small[0]
        lines[node.lineno - 1] = f"{targets} = {value}"
    return "\n".join(lines) + "\n"


def sites_of(problem: Path, device: str, out: Path) -> list[dict]:
    report = list_sites(ListSitesConfig(model=str(problem), device=device, out=out,
                                        profile=ProfileConfig(warmup=1, trials=3), quiet=True))
    return [s for s in report["sites"] if s["family"] in FAMILIES]


def judge_sites(name: str, sites: list[dict], evaluator: Evaluator, timed: bool) -> list[Row]:
    rows = []
    generator = RulesGenerator()
    for site in sites:
        problem = Path(site["problem"])
        row = Row(name, site["id"], site["family"], site["signature"][:60], "")
        reason = declined(problem)
        if reason:
            row.outcome = f"declined: {reason[:90]}"
            rows.append(row)
            continue
        proposals = generator.propose(problem, None, 32)
        compiled = [p for p in proposals.children if p.settings.get("writer") == "write_compiled"]
        if not compiled:
            row.outcome = f"no draft: {proposals.declined[:90]}"
            rows.append(row)
            continue
        verdict = evaluator.evaluate(problem, compiled[0].source)
        row.outcome = "correct" if verdict.correct else f"wrong: {verdict.reason[:90]}"
        row.speedup = verdict.speedup if timed and verdict.correct else None
        rows.append(row)
    return rows


def table(rows: list[Row]) -> str:
    lines = ["| problem | site | family | signature | compiler | vs eager |",
             "| --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        speed = "-" if r.speedup is None else f"{r.speedup:.2f}x"
        lines.append(f"| {r.problem} | {r.site} | {r.family} | {r.signature.replace('|', '/')} | "
                     f"{r.outcome.replace('|', '/')} | {speed} |")
    for family in FAMILIES:
        mine = [r for r in rows if r.family == family]
        correct = sum(r.outcome == "correct" for r in mine)
        refused = sum(r.outcome.startswith("declined") for r in mine)
        lines.append(f"\n{len(mine)} {family} sites: {correct} with a correct kernel, "
                     f"{refused} declined, {len(mine) - correct - refused} otherwise.")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.compiler_coverage_bench",
                                     description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("problems", nargs="*", type=Path)
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--shrink", action="store_true")
    parser.add_argument("--out", type=Path, default=Path("kiln-out/compiler-coverage"))
    args = parser.parse_args()
    problems = args.problems or sorted(DEV.glob("level*/*.py"))
    rows: list[Row] = []
    config = EvalConfig(device=args.device, time=args.device == "cuda")
    with Evaluator(config, workers=2) as evaluator:
        for problem in problems:
            if args.shrink:
                small = args.out / "problems" / problem.name
                small.parent.mkdir(parents=True, exist_ok=True)
                small.write_text(shrunk(problem.read_text()))
                problem = small
            try:
                sites = sites_of(problem, args.device, args.out / "sites")
            except Exception as err:  # a problem the profiler refuses is a row, not a stop
                rows.append(Row(problem.stem, "-", "-", "-", f"not profiled: {err}"[:120]))
                continue
            rows += judge_sites(problem.stem, sites, evaluator, args.device == "cuda")
            print(table(rows[-len(sites):] if sites else []).splitlines()[-1], file=sys.stderr)
    text = table(rows)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "compiler_coverage.md").write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
