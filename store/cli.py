"""`python -m store`: list runs and candidates, search, show, diff, best, export, upgrade.

Every command but `upgrade` only reads, through a read-only connection: it works on a store in
a read-only folder and never changes the file.
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from store.diffs import diff_candidates, diff_to_best, diff_to_parent
from store.export import EXPORT_FORMATS, export
from store.labels import CPU_TIMINGS
from store.migrations import MIGRATION_NAMES
from store.reader import StoreReader
from store.writer import Store

DEFAULT_DB = "kiln.db"
# Rationales and snippets are cut to this many characters in tables, to keep one row a line.
TEXT_WIDTH = 60

RUN_COLUMNS = [
    "id", "model_spec", "gpu", "status", "started_at", "sites", "candidates", "accepted",
    "timings_note",
]  # fmt: skip
CANDIDATE_COLUMNS = [
    "id", "parent_id", "site_id", "family", "tier", "generator", "verdict_label", "latency_ms",
    "speedup", "rationale",
]  # fmt: skip
BEST_COLUMNS = [
    "site_key", "id", "tier", "latency_ms", "speedup", "speedup_vs_eager", "speedup_vs_compile",
    "roofline_fraction",
]  # fmt: skip
# Table headings where the JSON key is longer than the column needs.
HEADINGS = {"verdict_label": "verdict", "timings_note": "timings"}


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.4g}"
    text = str(value).replace("\n", " ")
    return text if len(text) <= TEXT_WIDTH else text[: TEXT_WIDTH - 3] + "..."


def _table(rows: Sequence[dict[str, Any]], columns: Sequence[str]) -> str:
    cells = [[_cell(row[column]) for column in columns] for row in rows]
    headings = [HEADINGS.get(column, column) for column in columns]
    widths = [
        max([len(heading)] + [len(line[i]) for line in cells]) for i, heading in enumerate(headings)
    ]
    lines = [headings, *cells]
    return "\n".join(
        "  ".join(text.ljust(width) for text, width in zip(line, widths, strict=True)).rstrip()
        for line in lines
    )


def _emit(args: argparse.Namespace, data: Any, text: str) -> None:
    print(json.dumps(data, indent=2) if args.json else text)


def _listing(
    args: argparse.Namespace, rows: list[dict[str, Any]], columns: Sequence[str], empty: str
) -> None:
    """A table of `rows`, or when there are none one lowercase line, `empty`, on stdout."""
    _emit(args, rows, _table(rows, columns) if rows else empty)


def _runs(store: StoreReader, args: argparse.Namespace) -> None:
    _listing(args, [run.to_dict() for run in store.runs()], RUN_COLUMNS, "no runs yet")


def _candidates(store: StoreReader, args: argparse.Namespace) -> None:
    site_id, site_key = None, args.site
    if args.site is not None and args.site.isdigit():
        site_id, site_key = int(args.site), None
    listed = store.candidates(args.run, site_id, args.limit, site_key)
    _listing(args, [c.to_dict() for c in listed], CANDIDATE_COLUMNS, "no candidates")


def _search(store: StoreReader, args: argparse.Namespace) -> None:
    hits = store.search(args.query, fts_syntax=args.fts, run_id=args.run, limit=args.limit)
    rows = [hit.to_dict() for hit in hits]
    _listing(args, rows, [*CANDIDATE_COLUMNS[:-1], "snippet"], "no matches")


def _show(store: StoreReader, args: argparse.Namespace) -> None:
    candidate = store.candidate(args.id)
    data = candidate.to_dict()
    # The verdict in one word stands for the flags: a legacy accepted flag may mean slower.
    left_out = ("source", "verdict", "verdict_label", "accepted")
    header = {key: value for key, value in data.items() if key not in left_out}
    lines = [f"verdict: {candidate.summary.verdict_label}"]
    lines += [f"{key}: {_cell(value)}" for key, value in header.items()]
    if candidate.verdict is not None:
        lines += ["", "verdict:", json.dumps(candidate.verdict, indent=2)]
    lines += ["", "source:", candidate.source]
    _emit(args, data, "\n".join(lines))


def _diff(store: StoreReader, args: argparse.Namespace) -> None:
    if args.other is not None:
        diffs = [diff_candidates(store, args.id, args.other)]
    else:
        diffs = [diff_to_parent(store, args.id)]
        against_best = diff_to_best(store, args.id)
        if against_best is not None:
            diffs.append(against_best)
    text = "\n".join(
        f"# {d.base_label} -> candidate {d.candidate_id}\n{d.text or '(identical)'}" for d in diffs
    )
    _emit(args, [d.to_dict() for d in diffs], text)


def _best(store: StoreReader, args: argparse.Namespace) -> None:
    run = store.run(store.latest_run_id() if args.run is None else args.run)
    note = CPU_TIMINGS if run.cpu_timings else None
    rows = [{**c.to_dict(), "timings_note": note} for c in store.best(run.id)]
    text = _table(rows, BEST_COLUMNS) if rows else "no accepted candidate yet"
    if rows and note:
        text = f"run {run.id} ran on {run.gpu}: {note}\n{text}"
    _emit(args, rows, text)


def _export(store: StoreReader, args: argparse.Namespace) -> None:
    paths = export(store, args.format, Path(args.out), args.run, args.min_speedup)
    _emit(args, [str(path) for path in paths], "\n".join(str(path) for path in paths))


def _parser() -> argparse.ArgumentParser:
    # --db and --json go before or after the subcommand. A left-out option sets nothing
    # (SUPPRESS), so the subcommand's parser cannot reset a value given before it.
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--db",
        type=Path,
        default=argparse.SUPPRESS,
        help=f"the store file (default: $KILN_DB, else ./{DEFAULT_DB})",
    )
    common.add_argument(
        "--json", action="store_true", default=argparse.SUPPRESS, help="print JSON, not a table"
    )
    parser = argparse.ArgumentParser(
        prog="python -m store",
        description="Browse and export Kiln's kernel store.",
        parents=[common],
    )
    commands = parser.add_subparsers(dest="command", required=True)

    commands.add_parser("runs", parents=[common], help="list runs").set_defaults(act=_runs)

    listing = commands.add_parser("candidates", parents=[common], help="list candidates")
    listing.add_argument("--run", type=int, help="only this run's candidates")
    listing.add_argument(
        "--site",
        help="only this site's candidates: its id, or its key (e.g. reduction-1eccd0f77a); a key"
        " names the same op in every run that profiled it, so it lists all those runs' sites"
        " unless --run picks one",
    )
    listing.add_argument("--limit", type=int, help="at most this many")
    listing.set_defaults(act=_candidates)

    search = commands.add_parser("search", parents=[common], help="full-text search")
    search.add_argument(
        "query",
        help="words to find in sources, rationales, sites, reasons: every word, each as the"
        " start of a word (warp finds warps)",
    )
    search.add_argument("--fts", action="store_true", help="the query is SQLite FTS5 syntax")
    search.add_argument("--run", type=int, help="only this run's candidates")
    search.add_argument("--limit", type=int, default=50, help="at most this many (default 50)")
    search.set_defaults(act=_search)

    show = commands.add_parser("show", parents=[common], help="one candidate in full")
    show.add_argument("id", type=int, help="candidate id")
    show.set_defaults(act=_show)

    diff = commands.add_parser(
        "diff", parents=[common], help="diff a candidate against its parent and its site's best"
    )
    diff.add_argument("id", type=int, help="candidate id")
    diff.add_argument("other", type=int, nargs="?", help="diff ID -> OTHER instead")
    diff.set_defaults(act=_diff)

    best = commands.add_parser("best", parents=[common], help="the fastest accepted per site")
    best.add_argument("--run", type=int, help="run id (default: the latest)")
    best.set_defaults(act=_best)

    out = commands.add_parser("export", parents=[common], help="export kernels or records")
    out.add_argument(
        "--format",
        required=True,
        choices=EXPORT_FORMATS,
        help="package: an installable package of the winning kernels; kernelbench: each "
        "site's problem and fastest accepted kernel; json, csv: all records",
    )
    out.add_argument("--min-speedup", type=float, default=1.0,
                     help="package: only kernels faster than PyTorch by more than this")
    out.add_argument("--out", required=True, help="folder to write into")
    out.add_argument("--run", type=int, help="only this run (kernelbench: default the latest)")
    out.set_defaults(act=_export)

    commands.add_parser(
        "upgrade",
        parents=[common],
        help="bring a store written by an older Kiln to this one's schema (writes the file)",
    )
    return parser


def _upgrade(db: Path, args: argparse.Namespace) -> None:
    # The one command that writes: opening for writing applies the schema steps the store lacks.
    Store.open(db, create=False).close()
    text = f"{db} is at the current schema ({', '.join(MIGRATION_NAMES)})"
    _emit(args, {"db": str(db), "schema": list(MIGRATION_NAMES)}, text)


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    db = getattr(args, "db", None) or Path(os.environ.get("KILN_DB") or DEFAULT_DB)
    args.json = getattr(args, "json", False)
    if args.command == "upgrade":
        _upgrade(db, args)
        return 0
    with StoreReader.open(db, brief=True) as store:
        args.act(store, args)
    return 0
