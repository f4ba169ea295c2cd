"""Full-text search over candidates, narrowed by filters: one search for the CLI and the app."""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass
from typing import Any

from sqlite_utils import Database

from core.runtime.errors import KilnInputError
from store.labels import VERDICT_SQL, VERDICTS

_JOINS = "JOIN sites s ON s.id = c.site_id LEFT JOIN verdicts v ON v.id = c.verdict_id"


@dataclass(frozen=True)
class SearchFilters:
    """What a search is narrowed to; an empty tuple means any. `verdicts` are `VERDICTS`."""

    tiers: tuple[str, ...] = ()
    generators: tuple[str, ...] = ()
    verdicts: tuple[str, ...] = ()
    families: tuple[str, ...] = ()
    gpus: tuple[str, ...] = ()
    runs: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        unknown = [verdict for verdict in self.verdicts if verdict not in VERDICT_SQL]
        if unknown:
            raise KilnInputError(
                f"unknown verdict filter {', '.join(map(repr, unknown))}",
                f"filter on one of: {', '.join(VERDICTS)}",
            )


def plain_words(text: str) -> str:
    """Each word of `text` as a quoted FTS5 prefix query: `warp` finds "warps".

    Quoting every word, its own double quotes doubled, leaves no FTS5 syntax in user text: AND,
    OR, NOT, NEAR, `column:` and parentheses are searched for as written.
    """
    return " ".join('"{}"*'.format(word.replace('"', '""')) for word in text.split())


def _in(column: str, name: str, values: tuple, params: dict[str, Any]) -> str:
    names = []
    for index, value in enumerate(values):
        params[f"{name}{index}"] = value
        names.append(f":{name}{index}")
    return f"{column} IN ({', '.join(names)})"


def _clauses(filters: SearchFilters, params: dict[str, Any]) -> list[str]:
    """SQL conditions on candidates `c`, sites `s` and verdicts `v` for the filters given."""
    clauses = [
        _in(column, name, values, params)
        for column, name, values in (
            ("c.tier", "tier", filters.tiers),
            ("c.generator", "generator", filters.generators),
            ("s.family", "family", filters.families),
            ("s.run_id", "run", filters.runs),
        )
        if values
    ]
    if filters.gpus:
        on_gpus = _in("gpu", "gpu", filters.gpus, params)
        clauses.append(f"s.run_id IN (SELECT id FROM runs WHERE {on_gpus})")
    if filters.verdicts:
        clauses.append("(" + " OR ".join(f"({VERDICT_SQL[v]})" for v in filters.verdicts) + ")")
    return clauses


def _newest(db: Database, filters: SearchFilters, limit: int) -> dict[int, str | None]:
    params: dict[str, Any] = {"limit": limit}
    clauses = _clauses(filters, params)
    where = f"WHERE {' AND '.join(clauses)}" if clauses else ""
    rows = db.execute(
        f"SELECT c.id FROM candidates c {_JOINS} {where} ORDER BY c.id DESC LIMIT :limit", params
    )
    return {row[0]: None for row in rows}


def find(
    db: Database,
    query: str,
    *,
    fts_syntax: bool,
    filters: SearchFilters,
    limit: int,
    ranked_matches_max: int,
) -> dict[int, str | None]:
    """The ids of the candidates matching `query` and `filters`, best first, with snippets.

    Plain text matches every word given as a word prefix, in any order. With `fts_syntax` the
    query is SQLite FTS5 syntax, and invalid syntax is a `KilnInputError`. Best matches (BM25)
    come first; a query matching more than `ranked_matches_max` candidates lists the newest
    first instead. A blank query lists the newest candidates that pass the filters.
    """
    if not query.strip():
        return _newest(db, filters, limit)
    params: dict[str, Any] = {"match": query if fts_syntax else plain_words(query)}
    within_runs = ""
    if filters.runs:
        low_high = db.execute(
            "SELECT min(c.id), max(c.id) FROM candidates c JOIN sites s ON s.id = c.site_id"
            f" WHERE {_in('s.run_id', 'span', filters.runs, params)}",
            params,
        ).fetchone()
        if low_high[0] is None:
            return {}
        params["low"], params["high"] = low_high
        # The id span of the runs lets the index skip other runs' matches before any join.
        within_runs = "AND candidate_fts.rowid BETWEEN :low AND :high"
    clauses = _clauses(filters, params)
    joins = f"JOIN candidates c ON c.id = candidate_fts.rowid {_JOINS}" if clauses else ""
    narrowed = "".join(f" AND {clause}" for clause in clauses)
    params["limit"] = limit
    try:
        # The count is of the index's matches within the runs' span, before the other filters:
        # counting through them would cost the join this rule is there to keep cheap.
        (matches,) = db.execute(
            f"SELECT count(*) FROM candidate_fts WHERE candidate_fts MATCH :match {within_runs}",
            params,
        ).fetchone()
        newest_first = matches > ranked_matches_max
        order = "candidate_fts.rowid DESC" if newest_first else "bm25(candidate_fts)"
        # Rank on the index (and the filters' joins) alone; the caller fetches the rows of the
        # few shown, as joining every column before the LIMIT would build one for every match.
        rows = db.execute(
            "SELECT candidate_fts.rowid, snippet(candidate_fts, -1, '[', ']', '...', 12)"
            f" FROM candidate_fts {joins}"
            f" WHERE candidate_fts MATCH :match {within_runs}{narrowed}"
            f" ORDER BY {order} LIMIT :limit",
            params,
        ).fetchall()
    except sqlite3.OperationalError as err:
        # The statements are fixed; a plain SQLITE_ERROR here comes from the query text.
        if not fts_syntax or getattr(err, "sqlite_errorname", "") != "SQLITE_ERROR":
            raise
        raise KilnInputError(
            f"the search {query!r} is not valid full-text search syntax: {err}",
            'quote phrases with "double quotes" and balance parentheses, or search without'
            " --fts (in the app: turn off full-text search syntax) to match the words as written",
        ) from err
    return dict(rows)
