"""Exports: KernelBench problem/solution pairs of the winners, or every record as JSON or CSV."""

from __future__ import annotations

import csv
import json
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from core.runtime.errors import KilnInputError
from store.reader import StoreReader
from store.site_names import check_site_keys

EXPORT_FORMATS = ("package", "kernelbench", "json", "csv")
PROBLEM_FILE = "problem.py"
SOLUTION_FILE = "model_new.py"


@contextmanager
def _writing(path: Path) -> Iterator[None]:
    try:
        yield
    except OSError as err:
        raise KilnInputError(
            f"cannot write {path}: {err.strerror or err}", "pass --out with a writable folder"
        ) from err


def _prepare(out: Path) -> None:
    with _writing(out):
        out.mkdir(parents=True, exist_ok=True)


def _write(path: Path, text: str) -> None:
    with _writing(path):
        path.write_text(text)


def export_kernelbench(store: StoreReader, out: Path, run_id: int | None = None) -> list[Path]:
    """Per site with an accepted candidate: `<site key>/problem.py` and its fastest solution.

    Each pair runs as is with `python -m core.evaluate problem.py model_new.py`.
    """
    winners = store.best(run_id)
    if not winners:
        run = store.latest_run_id() if run_id is None else run_id
        raise KilnInputError(
            f"run {run} has no accepted candidate to export",
            "let the search accept a kernel first, or pick another run with --run",
        )
    check_site_keys((winner.site_key for winner in winners), winners[0].run_id)
    _prepare(out)
    written = []
    for winner in winners:
        folder = out / winner.site_key
        _prepare(folder)
        _write(folder / PROBLEM_FILE, store.site(winner.site_id).problem_source)
        _write(folder / SOLUTION_FILE, store.candidate(winner.id).source)
        written += [folder / PROBLEM_FILE, folder / SOLUTION_FILE]
    return written


def _table_sql(run_id: int | None) -> dict[str, tuple[str, list[Any]]]:
    """Each table's rows, of one run or all; the full-text index is derived and left out."""
    scope = [] if run_id is None else [run_id]

    def where(column: str) -> str:
        return "" if run_id is None else f" WHERE {column} = ?"

    return {
        "runs": (f"SELECT r.* FROM runs r{where('r.id')} ORDER BY r.id", scope),
        "models": (
            "SELECT * FROM models WHERE id IN (SELECT model_id FROM runs r"
            f"{where('r.id')}) ORDER BY id",
            scope,
        ),
        "sites": (f"SELECT * FROM sites{where('run_id')} ORDER BY id", scope),
        "llm_calls": (f"SELECT * FROM llm_calls{where('run_id')} ORDER BY id", scope),
        "candidates": (
            "SELECT c.*, s.run_id, s.key AS site_key, s.family, v.accepted, v.latency_ms,"
            " v.speedup FROM candidates c JOIN sites s ON s.id = c.site_id"
            f" LEFT JOIN verdicts v ON v.id = c.verdict_id{where('s.run_id')} ORDER BY c.id",
            scope,
        ),
        "verdicts": (
            "SELECT v.* FROM verdicts v JOIN candidates c ON c.id = v.candidate_id"
            f" JOIN sites s ON s.id = c.site_id{where('s.run_id')} ORDER BY v.id",
            scope,
        ),
    }


def _rows(store: StoreReader, sql: str, params: list[Any]) -> tuple[list[str], Iterator[tuple]]:
    cursor = store.db.execute(sql, params)
    return [column[0] for column in cursor.description], iter(cursor)


def _json_row(names: list[str], row: tuple) -> dict[str, Any]:
    record = dict(zip(names, row, strict=True))
    for name in ("versions", "config", "e2e", "ops", "library_ops", "verdict"):
        if isinstance(record.get(name), str):
            record[name] = json.loads(record[name])
    return record


def _write_json_list(handle: Any, items: Iterable[dict[str, Any]]) -> None:
    handle.write("[")
    for index, item in enumerate(items):
        handle.write(",\n  " if index else "\n  ")
        handle.write(json.dumps(item))
    handle.write("\n]")


def export_json(store: StoreReader, out: Path, run_id: int | None = None) -> list[Path]:
    """One `kiln-export.json`: each table as a list of objects, JSON columns parsed."""
    if run_id is not None:
        store.run(run_id)
    _prepare(out)
    path = out / "kiln-export.json"
    with _writing(path), path.open("w") as handle:
        handle.write("{")
        for index, (table, (sql, params)) in enumerate(_table_sql(run_id).items()):
            handle.write(f'{"," if index else ""}\n"{table}": ')
            names, rows = _rows(store, sql, params)
            _write_json_list(handle, (_json_row(names, row) for row in rows))
        handle.write("\n}\n")
    return [path]


def export_csv(store: StoreReader, out: Path, run_id: int | None = None) -> list[Path]:
    """One CSV per table; candidates carry their site and latest verdict's headline numbers."""
    if run_id is not None:
        store.run(run_id)
    _prepare(out)
    written = []
    for table, (sql, params) in _table_sql(run_id).items():
        path = out / f"{table}.csv"
        names, rows = _rows(store, sql, params)
        with _writing(path), path.open("w", newline="") as handle:
            writer = csv.writer(handle)
            writer.writerow(names)
            writer.writerows(rows)
        written.append(path)
    return written


def export(store: StoreReader, fmt: str, out: Path, run_id: int | None = None,
           min_speedup: float = 1.0) -> list[Path]:
    """Write a run's kernels or records as `fmt`; `min_speedup` applies to `package`."""
    # Imported here: the package export needs torch, which the rest of the CLI does not.
    from store.package import export_package

    exporters = {
        "package": lambda s, o, r: export_package(s, o, r, min_speedup),
        "kernelbench": export_kernelbench,
        "json": export_json,
        "csv": export_csv,
    }
    if fmt not in exporters:
        raise KilnInputError(
            f"unknown export format {fmt!r}", f"use one of: {', '.join(EXPORT_FORMATS)}"
        )
    return exporters[fmt](store, out, run_id)
