"""Schema and migrations: applied once, in order; pragmas on every connection; upgrades."""

from __future__ import annotations

import json
import sqlite3
import threading

import pytest
from sqlite_utils import Database
from store_fixture import fill_store, run_cli, triton_candidate

from core.runtime.errors import KilnInputError
from store import Store, open_reader
from store.migrations import MIGRATION_NAMES, MIGRATIONS

TABLES = {"models", "runs", "sites", "candidates", "verdicts", "llm_calls", "candidate_fts"}


def applied(path) -> list[str]:
    with Database(path) as db:
        return [migration.name for migration in MIGRATIONS.applied(db)]


def test_new_store_has_every_migration_and_table(tmp_path):
    path = tmp_path / "kiln.db"
    with Store.open(path) as store:
        assert set(store.db.table_names()) >= TABLES
    assert applied(path) == list(MIGRATION_NAMES)


def test_reopening_applies_nothing_twice_and_keeps_data(tmp_path):
    filled = fill_store(tmp_path / "kiln.db")
    for _ in range(2):
        with Store.open(filled.path) as store:
            assert len(store.candidates()) == 5
    assert applied(filled.path) == list(MIGRATION_NAMES)


def test_every_connection_enforces_foreign_keys_and_waits_for_locks(tmp_path):
    filled = fill_store(tmp_path / "kiln.db")
    with Store.open(filled.path) as store:
        assert store.db.journal_mode == "wal"
        assert store.db.execute("PRAGMA busy_timeout").fetchone()[0] == 10_000
        with pytest.raises(sqlite3.IntegrityError, match="FOREIGN KEY"):
            store.db.execute(
                "INSERT INTO candidates (site_id, tier, generator, rationale, source,"
                " source_hash, created_at) VALUES (999, 'triton', 'rules', '', 'x', 'h', '')"
            )
    with open_reader(filled.path) as reader:
        assert reader.db.execute("PRAGMA foreign_keys").fetchone()[0] == 1
        assert reader.db.execute("PRAGMA busy_timeout").fetchone()[0] == 10_000


def test_reader_is_read_only_and_usable_from_another_thread(tmp_path):
    filled = fill_store(tmp_path / "kiln.db")
    reader = open_reader(filled.path)
    found: list[int] = []
    thread = threading.Thread(target=lambda: found.extend(c.id for c in reader.search("mask")))
    thread.start()
    thread.join()
    assert filled.draft in found, f"search from another thread found {found}"
    with pytest.raises(sqlite3.OperationalError, match="readonly"):
        reader.db.execute("DELETE FROM verdicts")
    reader.close()


def older_store(path) -> None:
    """A store as the first release wrote it: one run, one site, one candidate."""
    with Database(path) as db:
        MIGRATIONS.apply(db, stop_before="m002_search")
        db.execute("INSERT INTO models VALUES (1, 'm.py', 'h', '2026-01-01')")
        db.execute(
            "INSERT INTO runs (id, model_id, gpu, versions, config, status, started_at,"
            " heartbeat_at, writer_host, writer_pid) VALUES (1, 1, 'H200', '{}', '{}', 'done',"
            " '2026-01-01T00:00:00+00:00', '2026-01-01T00:00:00+00:00', 'elsewhere', 1)"
        )
        db.execute(
            "INSERT INTO sites (id, run_id, key, family, signature, ops, calls, share,"
            " problem_source, created_at) VALUES (1, 1, 'pointwise-00000000', 'pointwise',"
            " 'relu(f32[8])', '[\"aten.relu\"]', 1, 0.5, 'problem', '2026-01-01')"
        )
        db.execute(
            "INSERT INTO candidates (id, site_id, tier, generator, rationale, source,"
            " source_hash, created_at) VALUES (1, 1, 'triton', 'rules', 'older draft', ?, 'h',"
            " '2026-01-01')",
            [triton_candidate(512)],
        )


def test_store_at_an_older_schema_is_upgraded_and_its_candidates_indexed(tmp_path):
    path = tmp_path / "old.db"
    older_store(path)
    assert applied(path) == ["m001_records"]

    with pytest.raises(KilnInputError, match="older Kiln"):
        open_reader(path)
    with Store.open(path) as store:
        assert [hit.id for hit in store.search("older draft")] == [1]
        assert [hit.id for hit in store.search("relu")] == [1]
    assert applied(path) == list(MIGRATION_NAMES)
    with open_reader(path) as reader:
        assert reader.run(1).status == "done"


def test_read_commands_leave_an_older_store_alone_and_upgrade_brings_it_up(tmp_path):
    path = tmp_path / "old.db"
    older_store(path)
    refused = run_cli("--db", str(path), "runs")
    assert refused.returncode == 2, refused.stderr
    assert "written by an older Kiln" in refused.stderr
    assert f"python -m store --db {path} upgrade" in refused.stderr
    assert applied(path) == ["m001_records"]
    upgraded = run_cli("--db", str(path), "upgrade", "--json")
    assert upgraded.returncode == 0, upgraded.stderr
    assert json.loads(upgraded.stdout) == {"db": str(path), "schema": list(MIGRATION_NAMES)}
    assert applied(path) == list(MIGRATION_NAMES)
    listed = run_cli("--db", str(path), "--json", "candidates")
    assert [row["rationale"] for row in json.loads(listed.stdout)] == ["older draft"]
