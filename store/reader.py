"""Reading a store: runs, sites, candidates, lineage, search, the best kernel of each site."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Self

from sqlite_utils import Database

from core.runtime.errors import KilnInputError
from store.db import connect_reader
from store.labels import ACCEPTED, SLOWER, VERDICT_SQL, VERDICTS
from store.liveness import run_writer_alive
from store.records import (
    Candidate,
    CandidateSummary,
    Judging,
    LlmCall,
    Run,
    RunHeartbeat,
    Site,
    StoreVersion,
)
from store.search import SearchFilters, find

_ACCEPTED_SQL = VERDICT_SQL[ACCEPTED]
_RUN_SQL = f"""
    SELECT r.*, m.spec AS model_spec, m.hash AS model_hash,
        (SELECT count(*) FROM sites s WHERE s.run_id = r.id) AS n_sites,
        (SELECT count(*) FROM candidates c JOIN sites s ON s.id = c.site_id
            WHERE s.run_id = r.id) AS n_candidates,
        (SELECT count(*) FROM candidates c JOIN sites s ON s.id = c.site_id
            JOIN verdicts v ON v.id = c.verdict_id
            WHERE s.run_id = r.id AND {_ACCEPTED_SQL}) AS n_accepted
    FROM runs r JOIN models m ON m.id = r.model_id
"""

_SUMMARY_COLUMNS = """
    c.id, c.parent_id, c.site_id, s.run_id, s.key AS site_key, s.family, c.tier, c.generator,
    c.rationale, c.created_at, v.compiled, v.correct, v.accepted, v.latency_ms, v.speedup,
    v.speedup_vs_eager, v.speedup_vs_compile, v.roofline_fraction, v.reason, v.reason_code
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
# BM25 ranking costs time per matching candidate, past the 100 ms target when every candidate
# of a 100,000-candidate store matches, so past this many matches a search lists the newest
# first; counting the matches first costs little (bench/results/store_bench.md).
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
    def open(cls, path: str | Path, *, brief: bool = False) -> StoreReader:
        """`brief`: for one command's reads, which works in a read-only folder as well."""
        path = Path(path)
        return cls(connect_reader(path, brief=brief), path)

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
        self,
        run_id: int | None = None,
        site_id: int | None = None,
        limit: int | None = None,
        site_key: str | None = None,
    ) -> list[CandidateSummary]:
        """Candidates in the order they were proposed, optionally of one run or one site.

        A `site_key` names the same op in every run that profiled it, so it keeps the
        candidates of all those runs' sites of that key, or of `run_id`'s alone.
        """
        where, params = self._scope(run_id, site_id, site_key)
        sql = f"{_SUMMARY_SQL} {where} ORDER BY c.id"
        if limit is not None:
            sql += " LIMIT :limit"
            params["limit"] = limit
        return [_summary(row) for row in self._rows(sql, params)]

    def _scope(
        self, run_id: int | None, site_id: int | None, site_key: str | None = None
    ) -> tuple[str, dict[str, Any]]:
        clauses, params = [], {}
        if run_id is not None:
            self._require("runs", "run", run_id)
            clauses.append("s.run_id = :run_id")
            params["run_id"] = run_id
        if site_id is not None:
            self._require("sites", "site", site_id)
            clauses.append("c.site_id = :site_id")
            params["site_id"] = site_id
        if site_key is not None:
            clauses.append("s.key = :site_key")
            params["site_key"] = site_key
            self._require_site_key(site_key, run_id)
        return ("WHERE " + " AND ".join(clauses) if clauses else ""), params

    def _require_site_key(self, key: str, run_id: int | None) -> None:
        runs = [row[0] for row in self.db.execute("SELECT run_id FROM sites WHERE key = ?", [key])]
        if run_id is None and not runs:
            raise KilnInputError(
                f"there is no site {key} in {self.path}",
                "pass a site id or key from: python -m store --json candidates (site_id, site_key)",
            )
        if run_id is not None and run_id not in runs:
            elsewhere = f" (runs with it: {', '.join(map(str, runs))})" if runs else ""
            raise KilnInputError(
                f"run {run_id} has no site {key}{elsewhere}",
                "leave out --run to list that site's candidates in every run, or pick another",
            )

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
        filters: SearchFilters | None = None,
        limit: int = 50,
    ) -> list[CandidateSummary]:
        """Candidates whose source, rationale, site signature or ops, or rejection reason match.

        Plain text matches every word given as a word prefix, in any order. With `fts_syntax`
        the query is SQLite FTS5 syntax (AND/OR/NOT, "phrases", prefix*, NEAR, `column:`
        filters), and invalid syntax is a `KilnInputError`. Best matches (BM25) come first; a
        query matching more than `RANKED_MATCHES_MAX` candidates lists the newest first instead.
        A blank query lists the newest candidates. `run_id` keeps one run's candidates, in place
        of `filters.runs`.
        """
        filters = filters or SearchFilters()
        if run_id is not None:
            self._require("runs", "run", run_id)
            filters = replace(filters, runs=(run_id,))
        snippets = find(
            self.db,
            query,
            fts_syntax=fts_syntax,
            filters=filters,
            limit=limit,
            ranked_matches_max=RANKED_MATCHES_MAX,
        )
        listed = ", ".join(str(ident) for ident in snippets)
        rows = {row["id"]: row for row in self._rows(f"{_SUMMARY_SQL} WHERE c.id IN ({listed})")}
        return [_summary({**rows[ident], "snippet": text}) for ident, text in snippets.items()]

    def filter_choices(self) -> SearchFilters:
        """Every value each search filter can take in this store; runs newest first."""

        def distinct(sql: str) -> tuple:
            return tuple(row[0] for row in self.db.execute(sql).fetchall())

        return SearchFilters(
            tiers=distinct("SELECT DISTINCT tier FROM candidates ORDER BY 1"),
            generators=distinct("SELECT DISTINCT generator FROM candidates ORDER BY 1"),
            verdicts=VERDICTS,
            families=distinct("SELECT DISTINCT family FROM sites ORDER BY 1"),
            gpus=distinct("SELECT DISTINCT gpu FROM runs ORDER BY 1"),
            runs=distinct("SELECT id FROM runs ORDER BY id DESC"),
        )

    def children(self, candidate_id: int) -> list[int]:
        """The candidates made from this one, in the order they were proposed."""
        self._require("candidates", "candidate", candidate_id)
        rows = self.db.execute(
            "SELECT id FROM candidates WHERE parent_id = ? ORDER BY id", [candidate_id]
        )
        return [row[0] for row in rows]

    def ancestors(self, candidate_id: int) -> list[int]:
        """Parent, grandparent and so on up to the first draft, in one query however deep."""
        self._require("candidates", "candidate", candidate_id)
        rows = self.db.execute(
            """WITH RECURSIVE line(id, parent_id, depth) AS (
                SELECT id, parent_id, 0 FROM candidates WHERE id = :id
                UNION ALL
                SELECT c.id, c.parent_id, line.depth + 1
                FROM candidates c JOIN line ON c.id = line.parent_id
            ) SELECT id FROM line WHERE depth > 0 ORDER BY depth""",
            {"id": candidate_id},
        )
        return [row[0] for row in rows]

    def version(self) -> StoreVersion:
        """Changes whenever anything is written, a run finishes, or a running run's writer dies."""
        *last_ids, last_finished_at = self.db.execute(
            "SELECT (SELECT max(id) FROM runs), (SELECT max(id) FROM sites),"
            " (SELECT max(id) FROM candidates), (SELECT max(id) FROM verdicts),"
            " (SELECT max(id) FROM llm_calls), (SELECT max(finished_at) FROM runs)"
        ).fetchone()
        now = datetime.now(UTC)
        running = tuple(
            RunHeartbeat(row["id"], row["heartbeat_at"], run_writer_alive(row, now))
            for row in self._rows("SELECT * FROM runs WHERE status = 'running' ORDER BY id")
        )
        return StoreVersion(tuple(last_ids), last_finished_at, running)

    def best(self, run_id: int | None = None, *, slower: bool = False) -> list[CandidateSummary]:
        """The fastest accepted candidate of each site of a run (the latest run by default);
        with `slower`, candidates proven correct but not faster than PyTorch count too."""
        run_id = self.latest_run_id() if run_id is None else run_id
        self._require("runs", "run", run_id)
        kept = f"({_ACCEPTED_SQL}) OR ({VERDICT_SQL[SLOWER]})" if slower else _ACCEPTED_SQL
        rows = self._rows(
            f"""
            SELECT * FROM (
                SELECT {_SUMMARY_COLUMNS}, s.share AS share, row_number() OVER (
                    PARTITION BY c.site_id ORDER BY v.latency_ms, c.id) AS place
                {_SUMMARY_FROM}
                WHERE s.run_id = ? AND ({kept})
            ) WHERE place = 1 ORDER BY share DESC, site_id
            """,
            [run_id],
        )
        for row in rows:
            del row["share"], row["place"]
        return [_summary(row) for row in rows]

    def best_of_site(self, site_id: int) -> CandidateSummary | None:
        rows = self._rows(
            f"{_SUMMARY_SQL} WHERE c.site_id = ? AND {_ACCEPTED_SQL}"
            " ORDER BY v.latency_ms, c.id LIMIT 1",
            [site_id],
        )
        return _summary(rows[0]) if rows else None

    def llm_calls(self, run_id: int) -> list[LlmCall]:
        self._require("runs", "run", run_id)
        rows = self._rows("SELECT * FROM llm_calls WHERE run_id = ? ORDER BY id", [run_id])
        return [LlmCall(**row) for row in rows]

    def judging(self, run_id: int) -> list[Judging]:
        """Where the time of judging each candidate of a run went, in the order proposed."""
        self._require("runs", "run", run_id)
        rows = self._rows(
            """
            SELECT c.id AS candidate_id, c.site_id, c.created_at AS proposed_at,
                v.created_at AS judged_at,
                json_extract(v.verdict, '$.eval_seconds') AS eval_seconds,
                json_extract(v.verdict, '$.phase_seconds') AS phase_seconds,
                json_extract(v.verdict, '$.peak_memory_bytes') AS peak_memory_bytes
            FROM candidates c JOIN sites s ON s.id = c.site_id
            JOIN verdicts v ON v.id = c.verdict_id
            WHERE s.run_id = ? ORDER BY c.id
            """,
            [run_id],
        )
        return [
            Judging(**{**row, "phase_seconds": json.loads(row["phase_seconds"] or "{}")})
            for row in rows
        ]
