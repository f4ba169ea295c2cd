"""Reading a store: runs, sites, candidates, full-text search, the best kernel of each site."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Self

from sqlite_utils import Database

from core.runtime.errors import KilnInputError
from store.db import connect_reader
from store.liveness import run_writer_alive
from store.records import Candidate, CandidateSummary, LlmCall, Run, Site

_RUN_SQL = """
    SELECT r.*, m.spec AS model_spec, m.hash AS model_hash,
        (SELECT count(*) FROM sites s WHERE s.run_id = r.id) AS n_sites,
        (SELECT count(*) FROM candidates c JOIN sites s ON s.id = c.site_id
            WHERE s.run_id = r.id) AS n_candidates,
        (SELECT count(*) FROM candidates c JOIN sites s ON s.id = c.site_id
            JOIN verdicts v ON v.id = c.verdict_id
            WHERE s.run_id = r.id AND v.accepted) AS n_accepted
    FROM runs r JOIN models m ON m.id = r.model_id
"""

_SUMMARY_COLUMNS = """
    c.id, c.parent_id, c.site_id, s.run_id, s.key AS site_key, s.family, c.tier, c.generator,
    c.rationale, c.created_at, v.compiled, v.correct, v.accepted, v.latency_ms, v.speedup,
    v.speedup_vs_eager, v.speedup_vs_compile, v.roofline_fraction, v.reason
"""
_SUMMARY_FROM = """
    FROM candidates c
    JOIN sites s ON s.id = c.site_id
    LEFT JOIN verdicts v ON v.id = c.verdict_id
"""
_SUMMARY_SQL = f"SELECT {_SUMMARY_COLUMNS} {_SUMMARY_FROM}"
_FULL_SQL = f"""
    SELECT {_SUMMARY_COLUMNS}, c.source, c.source_hash, c.llm_call_id, c.settings AS settings_json,
           v.verdict AS verdict_json
    {_SUMMARY_FROM}
"""
_BOOLEANS = ("compiled", "correct", "accepted")
# BM25 ranking costs 1-2 us per matching candidate (100-150 ms for 100,000 matches), so past
# this many matches a search lists the newest first to answer within 100 ms; counting the
# matches first costs 1-12 ms (bench/results/store_bench.md).
RANKED_MATCHES_MAX = 30_000


def _summary(row: dict[str, Any]) -> CandidateSummary:
    for name in _BOOLEANS:
        if row[name] is not None:
            row[name] = bool(row[name])
    return CandidateSummary(**row)


def _candidate(row: dict[str, Any]) -> Candidate:
    details = {name: row.pop(name) for name in ("source", "source_hash", "llm_call_id")}
    verdict, settings = row.pop("verdict_json"), row.pop("settings_json")
    return Candidate(
        summary=_summary(row),
        verdict=None if verdict is None else json.loads(verdict),
        settings=None if settings is None else json.loads(settings),
        **details,
    )


def _site(row: dict[str, Any]) -> Site:
    del row["created_at"]
    return Site(**{**row, "ops": json.loads(row["ops"])})


class StoreReader:
    """Queries over one store connection. `open` gives a read-only one usable from any thread."""

    def __init__(self, db: Database, path: Path) -> None:
        self.db = db
        self.path = path

    @classmethod
    def open(cls, path: str | Path) -> StoreReader:
        path = Path(path)
        return cls(connect_reader(path), path)

    def close(self) -> None:
        self.db.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _rows(self, sql: str, params: dict[str, Any] | list[Any] | None = None) -> list[dict]:
        cursor = self.db.execute(sql, params or [])
        names = [column[0] for column in cursor.description]
        return [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]

    def _missing(self, what: str, ident: int) -> KilnInputError:
        return KilnInputError(
            f"there is no {what} {ident} in {self.path}",
            "list what the store holds with: python -m store runs / candidates",
        )

    def _require(self, table: str, what: str, ident: int) -> None:
        if self.db.execute(f"SELECT 1 FROM {table} WHERE id = ?", [ident]).fetchone() is None:
            raise self._missing(what, ident)

    def _run(self, row: dict[str, Any], now: datetime) -> Run:
        status = row["status"]
        if status == "running" and not run_writer_alive(row, now):
            status = "interrupted"
        e2e = row["e2e"]
        return Run(
            id=row["id"],
            model_spec=row["model_spec"],
            model_hash=row["model_hash"],
            gpu=row["gpu"],
            versions=json.loads(row["versions"]),
            config=json.loads(row["config"]),
            status=status,
            started_at=row["started_at"],
            finished_at=row["finished_at"],
            heartbeat_at=row["heartbeat_at"],
            writer_host=row["writer_host"],
            writer_pid=row["writer_pid"],
            resumes=row["resumes"],
            e2e=None if e2e is None else json.loads(e2e),
            sites=row["n_sites"],
            candidates=row["n_candidates"],
            accepted=row["n_accepted"],
        )

    def runs(self) -> list[Run]:
        now = datetime.now(UTC)
        return [self._run(row, now) for row in self._rows(f"{_RUN_SQL} ORDER BY r.id")]

    def run(self, run_id: int) -> Run:
        rows = self._rows(f"{_RUN_SQL} WHERE r.id = ?", [run_id])
        if not rows:
            raise self._missing("run", run_id)
        return self._run(rows[0], datetime.now(UTC))

    def latest_run_id(self) -> int:
        row = self.db.execute("SELECT max(id) FROM runs").fetchone()
        if row[0] is None:
            raise KilnInputError(
                f"{self.path} holds no runs yet", "start one with: python -m core.optimize MODEL"
            )
        return row[0]

    def sites(self, run_id: int) -> list[Site]:
        self._require("runs", "run", run_id)
        rows = self._rows("SELECT * FROM sites WHERE run_id = ? ORDER BY share DESC, id", [run_id])
        return [_site(row) for row in rows]

    def site(self, site_id: int) -> Site:
        rows = self._rows("SELECT * FROM sites WHERE id = ?", [site_id])
        if not rows:
            raise self._missing("site", site_id)
        return _site(rows[0])

    def candidates(
        self, run_id: int | None = None, site_id: int | None = None, limit: int | None = None
    ) -> list[CandidateSummary]:
        """Candidates in the order they were proposed, optionally of one run or one site."""
        where, params = self._scope(run_id, site_id)
        sql = f"{_SUMMARY_SQL} {where} ORDER BY c.id"
        if limit is not None:
            sql += " LIMIT :limit"
            params["limit"] = limit
        return [_summary(row) for row in self._rows(sql, params)]

    def _scope(self, run_id: int | None, site_id: int | None) -> tuple[str, dict[str, Any]]:
        clauses, params = [], {}
        if run_id is not None:
            self._require("runs", "run", run_id)
            clauses.append("s.run_id = :run_id")
            params["run_id"] = run_id
        if site_id is not None:
            self._require("sites", "site", site_id)
            clauses.append("c.site_id = :site_id")
            params["site_id"] = site_id
        return ("WHERE " + " AND ".join(clauses) if clauses else ""), params

    def candidate(self, candidate_id: int) -> Candidate:
        rows = self._rows(f"{_FULL_SQL} WHERE c.id = ?", [candidate_id])
        if not rows:
            raise self._missing("candidate", candidate_id)
        return _candidate(rows[0])

    def iter_candidates(self, run_id: int | None = None) -> Iterator[Candidate]:
        """Every candidate (of one run) with its source and full verdict, in the order proposed.

        Rows stream from the database, so a store of any size fits in memory.
        """
        where, params = self._scope(run_id, None)
        cursor = self.db.execute(f"{_FULL_SQL} {where} ORDER BY c.id", params)
        names = [column[0] for column in cursor.description]
        for row in cursor:
            yield _candidate(dict(zip(names, row, strict=True)))

    def search(
        self,
        query: str,
        *,
        fts_syntax: bool = False,
        run_id: int | None = None,
        limit: int = 50,
    ) -> list[CandidateSummary]:
        """Candidates whose source, rationale, site signature or ops, or rejection reason match.

        Plain text matches every word given, in any order. With `fts_syntax` the query is SQLite
        FTS5 syntax (AND/OR/NOT, "phrases", prefix*, NEAR, `column:` filters), and invalid
        syntax is a `KilnInputError`. Best matches (BM25) come first; a query matching more than
        `RANKED_MATCHES_MAX` candidates lists the newest first instead.
        """
        match = query if fts_syntax else self.db.quote_fts(query)
        params: dict[str, Any] = {"match": match, "limit": limit, "run_id": run_id}
        within_run = join_run = ""
        if run_id is not None:
            self._require("runs", "run", run_id)
            params["low"], params["high"] = self.db.execute(
                "SELECT min(c.id), max(c.id) FROM candidates c JOIN sites s ON s.id = c.site_id"
                " WHERE s.run_id = ?",
                [run_id],
            ).fetchone()
            if params["low"] is None:
                return []
            # The id range lets the index skip other runs' matches before any join.
            within_run = "AND candidate_fts.rowid BETWEEN :low AND :high"
            join_run = (
                "JOIN candidates c ON c.id = candidate_fts.rowid"
                " JOIN sites s ON s.id = c.site_id AND s.run_id = :run_id"
            )
        try:
            (matches,) = self.db.execute(
                f"SELECT count(*) FROM candidate_fts WHERE candidate_fts MATCH :match {within_run}",
                params,
            ).fetchone()
            newest_first = matches > RANKED_MATCHES_MAX
            order = "candidate_fts.rowid DESC" if newest_first else "bm25(candidate_fts)"
            # Rank on the index alone, then fetch the rows of the few shown: joining the rows
            # before the LIMIT would build one for every match.
            snippets = dict(
                self.db.execute(
                    "SELECT candidate_fts.rowid,"
                    " snippet(candidate_fts, -1, '[', ']', '...', 12)"
                    f" FROM candidate_fts {join_run}"
                    f" WHERE candidate_fts MATCH :match {within_run}"
                    f" ORDER BY {order} LIMIT :limit",
                    params,
                ).fetchall()
            )
        except sqlite3.OperationalError as err:
            # The statements are fixed; a plain SQLITE_ERROR here comes from the query text.
            if not fts_syntax or getattr(err, "sqlite_errorname", "") != "SQLITE_ERROR":
                raise
            raise KilnInputError(
                f"the search {query!r} is not valid full-text search syntax: {err}",
                'quote phrases with "double quotes" and balance parentheses, or search without'
                " --fts to match the words as written",
            ) from err
        listed = ", ".join(str(ident) for ident in snippets)
        rows = {row["id"]: row for row in self._rows(f"{_SUMMARY_SQL} WHERE c.id IN ({listed})")}
        return [_summary({**rows[ident], "snippet": text}) for ident, text in snippets.items()]

    def best(self, run_id: int | None = None) -> list[CandidateSummary]:
        """The fastest accepted candidate of each site of a run (the latest run by default)."""
        run_id = self.latest_run_id() if run_id is None else run_id
        self._require("runs", "run", run_id)
        rows = self._rows(
            f"""
            SELECT * FROM (
                SELECT {_SUMMARY_COLUMNS}, s.share AS share, row_number() OVER (
                    PARTITION BY c.site_id ORDER BY v.latency_ms, c.id) AS place
                {_SUMMARY_FROM}
                WHERE s.run_id = ? AND v.accepted
            ) WHERE place = 1 ORDER BY share DESC, site_id
            """,
            [run_id],
        )
        for row in rows:
            del row["share"], row["place"]
        return [_summary(row) for row in rows]

    def best_of_site(self, site_id: int) -> CandidateSummary | None:
        rows = self._rows(
            f"{_SUMMARY_SQL} WHERE c.site_id = ? AND v.accepted"
            " ORDER BY v.latency_ms, c.id LIMIT 1",
            [site_id],
        )
        return _summary(rows[0]) if rows else None

    def llm_calls(self, run_id: int) -> list[LlmCall]:
        self._require("runs", "run", run_id)
        rows = self._rows("SELECT * FROM llm_calls WHERE run_id = ? ORDER BY id", [run_id])
        return [LlmCall(**row) for row in rows]
