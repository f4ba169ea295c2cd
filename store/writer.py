"""Writing a store: the optimizer's single writer.

Each call is one transaction, committed before it returns: a reader sees a candidate with its
search-index entry, or nothing of it, and a `kill -9` loses no call that returned. Group calls
that belong together (a candidate and its verdict) with `with store.batch():`.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sqlite_utils import Database

from core.runtime.errors import KilnInputError
from store.db import connect_writer, write_transaction
from store.liveness import run_writer_alive, this_writer
from store.migrations import FAMILIES, TIERS
from store.reader import StoreReader
from store.records import NewCandidate, RunState, utc_now
from store.verdicts import as_mapping, verdict_columns

FINISHED_STATUSES = ("done", "failed")
RESUMABLE_STATUSES = ("interrupted", "failed")


def source_hash(source: str) -> str:
    """Identity of a candidate's source: trailing spaces and blank edge lines do not count."""
    lines = [line.rstrip() for line in source.replace("\r\n", "\n").split("\n")]
    return hashlib.sha256("\n".join(lines).strip("\n").encode()).hexdigest()


def _choice(name: str, value: str, allowed: Sequence[str]) -> str:
    if value not in allowed:
        raise ValueError(f"{name} must be one of {', '.join(allowed)}, not {value!r}")
    return value


class Store(StoreReader):
    """A store open for writing; it reads like a `StoreReader` too."""

    def __init__(self, db: Database, path: Path) -> None:
        super().__init__(db, path)
        self.writer = this_writer()

    @classmethod
    def open(cls, path: str | Path, create: bool = True) -> Store:
        """Open (or create) the store, apply migrations, and mark runs whose writer died."""
        path = Path(path)
        store = cls(connect_writer(path, create), path)
        store.mark_interrupted()
        return store

    @contextmanager
    def batch(self) -> Iterator[None]:
        """Commit everything written inside the block together, or nothing of it."""
        with write_transaction(self.db):
            yield

    def _writer_columns(self) -> dict[str, Any]:
        return {
            "writer_host": self.writer.host,
            "writer_pid": self.writer.pid,
            "writer_token": self.writer.token,
        }

    def _insert(self, table: str, row: Mapping[str, Any]) -> int:
        names = ", ".join(row)
        values = ", ".join(f":{name}" for name in row)
        cursor = self.db.execute(f"INSERT INTO {table} ({names}) VALUES ({values})", dict(row))
        return cursor.lastrowid

    def _touch(self, run_id: int) -> None:
        """Refresh the run's heartbeat; only its own writer may write to a running run."""
        cursor = self.db.execute(
            "UPDATE runs SET heartbeat_at = :now WHERE id = :id AND status = 'running'"
            " AND writer_host = :writer_host AND writer_pid = :writer_pid",
            {"now": utc_now(), "id": run_id, **self._writer_columns()},
        )
        if cursor.rowcount != 1:
            row = self.db.execute(
                "SELECT status, writer_pid, writer_host FROM runs WHERE id = ?", [run_id]
            ).fetchone()
            if row is None:
                state = "does not exist"
            elif row[0] == "running":
                state = f"is written by pid {row[1]} on {row[2]}"
            else:
                state = f"is {row[0]}"
            raise ValueError(f"cannot write to run {run_id}: it {state}")

    def heartbeat(self, run_id: int) -> None:
        """Show the run is alive during a long stretch without writes."""
        with write_transaction(self.db):
            self._touch(run_id)

    def mark_interrupted(self) -> list[int]:
        """Mark 'running' runs whose writer is dead as 'interrupted'; their ids."""
        now = datetime.now(UTC)
        rows = self._rows("SELECT * FROM runs WHERE status = 'running'")
        dead = [row for row in rows if not run_writer_alive(row, now)]
        if dead:
            with write_transaction(self.db):
                for row in dead:
                    # The last heartbeat is the last moment the writer was seen working.
                    self.db.execute(
                        "UPDATE runs SET status = 'interrupted', finished_at = heartbeat_at"
                        " WHERE id = ? AND status = 'running' AND writer_pid = ?",
                        [row["id"], row["writer_pid"]],
                    )
        return [row["id"] for row in dead]

    def start_run(
        self,
        *,
        model_spec: str,
        model_hash: str,
        gpu: str,
        versions: Mapping[str, str],
        config: Mapping[str, Any],
    ) -> int:
        now = utc_now()
        with write_transaction(self.db):
            self.db.execute(
                "INSERT OR IGNORE INTO models (spec, hash, created_at) VALUES (?, ?, ?)",
                [model_spec, model_hash, now],
            )
            (model_id,) = self.db.execute(
                "SELECT id FROM models WHERE spec = ? AND hash = ?", [model_spec, model_hash]
            ).fetchone()
            row = {
                "model_id": model_id,
                "gpu": gpu,
                "versions": json.dumps(dict(versions)),
                "config": json.dumps(dict(config), default=str),
                "status": "running",
                "started_at": now,
                "heartbeat_at": now,
                **self._writer_columns(),
            }
            return self._insert("runs", row)

    def add_site(
        self,
        run_id: int,
        *,
        key: str,
        family: str,
        signature: str,
        ops: Sequence[str],
        calls: int,
        share: float,
        time_ms: float | None,
        eager_ms: float | None,
        compile_ms: float | None,
        floor_ms: float | None,
        problem_source: str,
        declined: str | None = None,
    ) -> int:
        if not 0.0 <= share <= 1.0:
            raise ValueError(f"share is a fraction of model time in [0, 1], not {share}")
        row = {
            "run_id": run_id,
            "key": key,
            "family": _choice("family", family, FAMILIES),
            "signature": signature,
            "ops": json.dumps(list(ops)),
            "calls": calls,
            "share": share,
            "time_ms": time_ms,
            "eager_ms": eager_ms,
            "compile_ms": compile_ms,
            "floor_ms": floor_ms,
            "problem_source": problem_source,
            "declined": declined,
            "created_at": utc_now(),
        }
        with write_transaction(self.db):
            self._touch(run_id)
            return self._insert("sites", row)

    def set_site_baselines(self, site_id: int, *, eager_ms: float | None,
                           compile_ms: float | None) -> None:
        """The site's own times in PyTorch, eager and under torch.compile, once measured."""
        run_id = self._run_of_site(site_id)
        with write_transaction(self.db):
            self._touch(run_id)
            self.db.execute("UPDATE sites SET eager_ms = ?, compile_ms = ? WHERE id = ?",
                            [eager_ms, compile_ms, site_id])

    def _run_of_site(self, site_id: int) -> int:
        row = self.db.execute("SELECT run_id FROM sites WHERE id = ?", [site_id]).fetchone()
        if row is None:
            raise ValueError(f"there is no site {site_id}")
        return row[0]

    def set_site_declined(self, site_id: int, why: str) -> None:
        """The site gets no kernels in this run, and why (read by the report and the app)."""
        run_id = self._run_of_site(site_id)
        with write_transaction(self.db):
            self._touch(run_id)
            self.db.execute("UPDATE sites SET declined = ? WHERE id = ?", [why, site_id])

    def add_candidate(
        self,
        site_id: int,
        *,
        parent_id: int | None,
        tier: str,
        generator: str,
        rationale: str,
        source: str,
        llm_call_id: int | None = None,
        settings: Mapping[str, Any] | None = None,
    ) -> NewCandidate:
        """Store a proposed kernel; a source the site already holds gives back the existing id.

        `settings` are the generator's knobs for this kernel, kept so a resumed search can
        refine it as the first search would have.
        """
        digest = source_hash(source)
        with write_transaction(self.db):
            self._touch(self._run_of_site(site_id))
            if parent_id is not None:
                parent = self.db.execute(
                    "SELECT site_id FROM candidates WHERE id = ?", [parent_id]
                ).fetchone()
                if parent is None or parent[0] != site_id:
                    where = "does not exist" if parent is None else f"is of site {parent[0]}"
                    raise ValueError(
                        f"parent candidate {parent_id} {where}; a parent is of the same site"
                    )
            existing = self.db.execute(
                "SELECT id FROM candidates WHERE site_id = ? AND source_hash = ?",
                [site_id, digest],
            ).fetchone()
            if existing is not None:
                return NewCandidate(id=existing[0], duplicate=True)
            row = {
                "site_id": site_id,
                "parent_id": parent_id,
                "tier": _choice("tier", tier, TIERS),
                "generator": generator,
                "rationale": rationale,
                "source": source,
                "source_hash": digest,
                "llm_call_id": llm_call_id,
                "settings": None if settings is None else json.dumps(dict(settings)),
                "created_at": utc_now(),
            }
            return NewCandidate(id=self._insert("candidates", row), duplicate=False)

    def add_verdict(self, candidate_id: int, verdict: Mapping[str, Any] | object) -> int:
        """Store the evaluator's verdict (a mapping or the `Verdict` dataclass) as the latest."""
        verdict = as_mapping(verdict)
        with write_transaction(self.db):
            row = self.db.execute(
                "SELECT c.site_id, s.run_id FROM candidates c JOIN sites s ON s.id = c.site_id"
                " WHERE c.id = ?",
                [candidate_id],
            ).fetchone()
            if row is None:
                raise ValueError(f"there is no candidate {candidate_id}")
            site_id, run_id = row
            self._touch(run_id)
            columns = verdict_columns(verdict, self.site(site_id))
            verdict_id = self._insert(
                "verdicts", {"candidate_id": candidate_id, **columns, "created_at": utc_now()}
            )
            self.db.execute(
                "UPDATE candidates SET verdict_id = ? WHERE id = ?", [verdict_id, candidate_id]
            )
            return verdict_id

    def add_llm_call(
        self,
        run_id: int,
        *,
        model: str,
        prompt: str,
        reply: str | None,
        prompt_tokens: int | None,
        completion_tokens: int | None,
        latency_ms: float | None,
        cost_usd: float | None,
        site_id: int | None = None,
        error: str | None = None,
    ) -> int:
        row = {
            "run_id": run_id,
            "site_id": site_id,
            "model": model,
            "prompt": prompt,
            "reply": reply,
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "latency_ms": latency_ms,
            "cost_usd": cost_usd,
            "error": error,
            "created_at": utc_now(),
        }
        with write_transaction(self.db):
            self._touch(run_id)
            return self._insert("llm_calls", row)

    def finish_run(
        self, run_id: int, *, status: str = "done", e2e: Mapping[str, Any] | None = None
    ) -> None:
        """Close a run: 'done' with its end-to-end results, or 'failed'."""
        _choice("status", status, FINISHED_STATUSES)
        with write_transaction(self.db):
            self._touch(run_id)
            self.db.execute(
                "UPDATE runs SET status = ?, finished_at = ?, e2e = ? WHERE id = ?",
                [status, utc_now(), None if e2e is None else json.dumps(dict(e2e)), run_id],
            )

    def resume_run(self, run_id: int) -> RunState:
        """Take over an interrupted (or failed) run; what it holds, for the search to go on."""
        self.mark_interrupted()
        with write_transaction(self.db):
            run = self.run(run_id)
            if run.status not in RESUMABLE_STATUSES:
                owner = f" by pid {run.writer_pid} on {run.writer_host}"
                raise KilnInputError(
                    f"run {run_id} cannot be resumed: it is {run.status}"
                    + (owner if run.status == "running" else ""),
                    "resume an interrupted run (python -m store runs lists them), or start anew",
                )
            self.db.execute(
                "UPDATE runs SET status = 'running', finished_at = NULL, heartbeat_at = :now,"
                " resumes = resumes + 1, writer_host = :writer_host, writer_pid = :writer_pid,"
                " writer_token = :writer_token WHERE id = :id",
                {"now": utc_now(), "id": run_id, **self._writer_columns()},
            )
        return RunState(
            run=self.run(run_id),
            sites=self.sites(run_id),
            candidates=list(self.iter_candidates(run_id)),
        )
