"""The pages' queries, cached per store path and version (a new write makes a new version)."""

from __future__ import annotations

import io
import sqlite3
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import streamlit as st

from app_pages.common import kernel_url, reader_for, verdict_label
from core.runtime.errors import KilnInputError
from store import (
    Candidate,
    Diff,
    Run,
    Site,
    StoreReader,
    diff_candidates,
    diff_to_best,
    diff_to_parent,
    export,
)
from store.reader import RANKED_MATCHES_MAX

# Cached results per function; a live run makes a new version every few seconds, and old
# versions are never asked for again.
MAX_VERSIONS = 16
SEARCH_LIMIT = 200


def _cache(func):
    return st.cache_data(max_entries=MAX_VERSIONS, show_spinner=False)(func)


@_cache
def runs(path: str, version: tuple) -> list[Run]:
    return reader_for(path).runs()


@_cache
def sites(path: str, version: tuple, run_id: int) -> list[Site]:
    return reader_for(path).sites(run_id)


@_cache
def candidate(path: str, version: tuple, candidate_id: int) -> Candidate:
    return reader_for(path).candidate(candidate_id)


@_cache
def children(path: str, version: tuple, candidate_id: int) -> list[int]:
    rows = reader_for(path).db.execute(
        "SELECT id FROM candidates WHERE parent_id = ? ORDER BY id", [candidate_id]
    )
    return [row[0] for row in rows]


@_cache
def ancestors(path: str, version: tuple, candidate_id: int) -> list[int]:
    """Parent, grandparent and so on up to the first draft, in one query however deep."""
    rows = reader_for(path).db.execute(
        """WITH RECURSIVE line(id, parent_id, depth) AS (
            SELECT id, parent_id, 0 FROM candidates WHERE id = :id
            UNION ALL
            SELECT c.id, c.parent_id, line.depth + 1
            FROM candidates c JOIN line ON c.id = line.parent_id
        ) SELECT id FROM line WHERE depth > 0 ORDER BY depth""",
        {"id": candidate_id},
    )
    return [row[0] for row in rows]


@_cache
def llm_call_of(path: str, version: tuple, run_id: int, call_id: int) -> dict | None:
    calls = [call for call in reader_for(path).llm_calls(run_id) if call.id == call_id]
    return calls[0].to_dict() if calls else None


@_cache
def diffs(path: str, version: tuple, candidate_id: int) -> tuple[Diff, Diff | None]:
    reader = reader_for(path)
    return diff_to_parent(reader, candidate_id), diff_to_best(reader, candidate_id)


@_cache
def diff_pair(path: str, version: tuple, base_id: int, candidate_id: int) -> Diff:
    return diff_candidates(reader_for(path), base_id, candidate_id)


def _frame(rows: list[dict]) -> pd.DataFrame:
    frame = pd.DataFrame(rows)
    if not frame.empty:
        frame["verdict"] = [
            verdict_label(row["compiled"], row["correct"], row["accepted"]) for row in rows
        ]
        frame["kernel"] = [kernel_url(row["id"]) for row in rows]
    return frame


@_cache
def site_candidates(path: str, version: tuple, site_id: int) -> pd.DataFrame:
    """Every candidate of a site in the order tried, with its verdict in one word."""
    return _frame([c.to_dict() for c in reader_for(path).candidates(site_id=site_id)])


@_cache
def best(path: str, version: tuple, run_id: int) -> dict[int, dict]:
    """The fastest accepted candidate of each site of a run, by site id."""
    return {c.site_id: c.to_dict() for c in reader_for(path).best(run_id)}


@dataclass(frozen=True)
class Filters:
    """What the Kernels page narrows a search to; an empty tuple means any."""

    tiers: tuple[str, ...] = ()
    generators: tuple[str, ...] = ()
    verdicts: tuple[str, ...] = ()
    families: tuple[str, ...] = ()
    gpus: tuple[str, ...] = ()
    runs: tuple[int, ...] = ()


_VERDICT_SQL = {
    "accepted": "v.accepted = 1",
    "rejected": "v.accepted = 0 AND v.correct = 1",
    "incorrect": "v.compiled = 1 AND v.correct = 0",
    "compile failed": "v.compiled = 0",
    "pending": "c.verdict_id IS NULL",
}


def _in(column: str, name: str, values: tuple, params: dict) -> str:
    names = []
    for index, value in enumerate(values):
        params[f"{name}{index}"] = value
        names.append(f":{name}{index}")
    return f"{column} IN ({', '.join(names)})"


def _where(filters: Filters, params: dict) -> list[str]:
    clauses = []
    for column, name, values in (
        ("c.tier", "tier", filters.tiers),
        ("c.generator", "generator", filters.generators),
        ("s.family", "family", filters.families),
        ("r.gpu", "gpu", filters.gpus),
        ("s.run_id", "run", filters.runs),
    ):
        if values:
            clauses.append(_in(column, name, values, params))
    if filters.verdicts:
        clauses.append("(" + " OR ".join(f"({_VERDICT_SQL[v]})" for v in filters.verdicts) + ")")
    return clauses


_COLUMNS = """c.id, c.parent_id, s.run_id, s.key AS site_key, s.family, r.gpu, c.tier,
    c.generator, c.rationale, v.compiled, v.correct, v.accepted, v.latency_ms, v.speedup,
    v.roofline_fraction, v.reason"""
_FROM = """FROM candidates c JOIN sites s ON s.id = c.site_id JOIN runs r ON r.id = s.run_id
    LEFT JOIN verdicts v ON v.id = c.verdict_id"""


@_cache
def search(
    path: str, version: tuple, text: str, fts_syntax: bool, filters: Filters
) -> pd.DataFrame:
    """Candidates matching the words (all of them) and the filters; best matches first.

    Without words, the newest candidates that pass the filters. A search matching more than
    `RANKED_MATCHES_MAX` candidates lists the newest first, as the store's own search does.
    """
    reader = reader_for(path)
    params: dict = {"limit": SEARCH_LIMIT}
    clauses = _where(filters, params)
    if not text.strip():
        where = f"WHERE {' AND '.join(clauses)}" if clauses else ""
        sql = f"SELECT {_COLUMNS}, NULL AS snippet {_FROM} {where} ORDER BY c.id DESC LIMIT :limit"
        return _frame(_rows(reader, sql, params))
    if not clauses:
        # The store's own search ranks on the index alone before fetching rows: about 20 ms
        # where the joined query below takes 1.7 s for 100,000 matches.
        try:
            found = reader.search(text, fts_syntax=fts_syntax, limit=SEARCH_LIMIT)
        except sqlite3.OperationalError as err:
            raise _bad_syntax(text, err) from err
        return _frame([_listed(c.to_dict()) for c in found])
    params["match"] = text if fts_syntax else reader.db.quote_fts(text)
    try:
        (matches,) = reader.db.execute(
            "SELECT count(*) FROM candidate_fts WHERE candidate_fts MATCH :match", params
        ).fetchone()
    except sqlite3.OperationalError as err:
        raise _bad_syntax(text, err) from err
    order = "c.id DESC" if matches > RANKED_MATCHES_MAX else "bm25(candidate_fts)"
    where = " AND ".join(["candidate_fts MATCH :match", *clauses])
    sql = (
        f"SELECT {_COLUMNS}, snippet(candidate_fts, -1, '[', ']', '...', 12) AS snippet"
        f" FROM candidate_fts JOIN candidates c ON c.id = candidate_fts.rowid"
        f" {_FROM.removeprefix('FROM candidates c')} WHERE {where} ORDER BY {order} LIMIT :limit"
    )
    return _frame(_rows(reader, sql, params))


def _bad_syntax(text: str, err: sqlite3.OperationalError) -> KilnInputError:
    # The statements are fixed; an error here comes from the query text.
    return KilnInputError(
        f"the search {text!r} is not valid full-text search syntax: {err}",
        'quote phrases with "double quotes" and balance parentheses, or turn off FTS syntax'
        " to match the words as written",
    )


def _listed(row: dict) -> dict:
    """A store search result in the columns of the joined query (the GPU comes from its run)."""
    return {**row, "gpu": None}


def _rows(reader: StoreReader, sql: str, params: dict) -> list[dict]:
    cursor = reader.db.execute(sql, params)
    names = [column[0] for column in cursor.description]
    return [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]


@_cache
def filter_choices(path: str, version: tuple) -> dict[str, list]:
    """The values each filter can take in this store."""
    db = reader_for(path).db

    def distinct(sql: str) -> list:
        return [row[0] for row in db.execute(sql).fetchall()]

    return {
        "tiers": distinct("SELECT DISTINCT tier FROM candidates ORDER BY 1"),
        "generators": distinct("SELECT DISTINCT generator FROM candidates ORDER BY 1"),
        "families": distinct("SELECT DISTINCT family FROM sites ORDER BY 1"),
        "gpus": distinct("SELECT DISTINCT gpu FROM runs ORDER BY 1"),
        "runs": distinct("SELECT id FROM runs ORDER BY id DESC"),
    }


def export_zip(path: str, fmt: str, run_id: int | None) -> bytes:
    """An export (`store.EXPORT_FORMATS`) as a zip, paths relative to the export folder."""
    with tempfile.TemporaryDirectory() as folder:
        out = Path(folder)
        written = export(reader_for(path), fmt, out, run_id)
        buffer = io.BytesIO()
        with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
            for file in written:
                archive.write(file, file.relative_to(out))
        return buffer.getvalue()
