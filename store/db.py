"""Connections to a store file: checks that leave a bad file untouched, pragmas, migrations.

Every connection enforces foreign keys and waits for locks instead of failing at once. The
writer's connection puts the file in WAL mode, so readers (the app, the CLI) read a consistent
snapshot while the optimizer writes, and a `kill -9` of the writer loses no committed
transaction: with `synchronous=NORMAL` a commit is in the WAL file before it returns, and only a
power cut can lose the last few, never corrupt the file.
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from sqlite_utils import Database

from core.runtime.errors import KilnInputError
from store.migrations import MIGRATION_NAMES, MIGRATIONS

SQLITE_HEADER = b"SQLite format 3\x00"
# How long a connection waits for another's lock before failing. Writes are short (a candidate
# with its verdict commits in about a millisecond, bench/results/store_bench.md) and there is one
# writer, so waiting means a checkpoint or a migration; ten seconds covers both with room.
BUSY_TIMEOUT_S = 10.0


def _check_sqlite_file(path: Path) -> None:
    if path.is_dir():
        raise KilnInputError(f"{path} is a folder, not a Kiln store", "pass --db PATH_TO_FILE")
    with path.open("rb") as handle:
        header = handle.read(len(SQLITE_HEADER))
    if header and header != SQLITE_HEADER:
        raise KilnInputError(
            f"{path} is not a SQLite database (its first bytes are {header[:8]!r})",
            "pass --db with a Kiln store, or a new path to create one",
        )


def _check_writable(path: Path) -> None:
    folder = path.parent
    if not folder.is_dir():
        raise KilnInputError(
            f"cannot create the Kiln store {path}: the folder {folder} does not exist",
            f"create {folder} first, or pass --db with a path in an existing folder",
        )
    # SQLite writes the journal files `-wal` and `-shm` beside the store, so the folder must be
    # writable as well as the file.
    for target in (folder, path):
        if target.exists() and not os.access(target, os.W_OK):
            raise KilnInputError(
                f"cannot write the Kiln store {path}: {target} is read-only",
                "pass --db with a writable location, or make it writable",
            )


def _applied_migrations(path: Path) -> list[str]:
    """The store's applied migrations, read without leaving a trace on a store to be refused.

    A read-only connection to a WAL store leaves `-wal` and `-shm` files behind. Without a
    `-wal` file no connection has the store open, so it is read as immutable, which creates
    nothing; with one, a writer may be at work and the normal read-only path is the safe one.
    """
    wal = path.with_name(path.name + "-wal")
    mode = "mode=ro" if wal.exists() else "mode=ro&immutable=1"
    conn = sqlite3.connect(f"{path.resolve().as_uri()}?{mode}", uri=True, timeout=BUSY_TIMEOUT_S)
    try:
        tables = {row[0] for row in conn.execute("SELECT name FROM sqlite_master")}
        if MIGRATIONS.migrations_table not in tables:
            if tables:
                raise KilnInputError(
                    f"{path} is a SQLite database but not a Kiln store",
                    "pass --db with a Kiln store, or a new path to create one",
                )
            return []
        rows = conn.execute(
            f"SELECT name FROM {MIGRATIONS.migrations_table} WHERE migration_set = ?"
            " ORDER BY rowid",
            [MIGRATIONS.name],
        )
        return [row[0] for row in rows]
    except sqlite3.DatabaseError as err:
        raise KilnInputError(
            f"cannot read {path} as a SQLite database: {err}",
            "pass --db with a Kiln store; restore this file from a copy if it was damaged",
        ) from err
    finally:
        conn.close()


def _check_schema(path: Path, applied: list[str]) -> None:
    unknown = [name for name in applied if name not in MIGRATION_NAMES]
    if unknown:
        raise KilnInputError(
            f"{path} was written by a newer Kiln (schema steps this one does not know: "
            f"{', '.join(unknown)})",
            "upgrade Kiln (pip install -U kiln), or pass --db with another store",
        )


def _configure(conn: sqlite3.Connection) -> Database:
    db = Database(conn)
    db.execute("PRAGMA foreign_keys = ON")
    db.execute(f"PRAGMA busy_timeout = {int(BUSY_TIMEOUT_S * 1000)}")
    return db


@contextmanager
def write_transaction(db: Database) -> Iterator[Database]:
    """A transaction that takes the write lock at its start.

    A deferred transaction that reads and then writes cannot wait for a lock another writer took
    in between (SQLite answers SQLITE_BUSY at once); taking the lock first makes it wait.
    Inside an open transaction this is a savepoint.
    """
    if db.conn.in_transaction:
        with db.atomic():
            yield db
        return
    db.conn.execute("BEGIN IMMEDIATE")
    try:
        yield db
    except BaseException:
        db.conn.execute("ROLLBACK")
        raise
    db.conn.execute("COMMIT")


def connect_writer(path: Path, create: bool) -> Database:
    """Open (or create) a store for writing, with every pending migration applied."""
    if path.exists():
        _check_sqlite_file(path)
    elif not create:
        raise KilnInputError(
            f"there is no Kiln store at {path}",
            "pass --db with the store's path, or set KILN_DB",
        )
    _check_writable(path)
    if path.exists():
        _check_schema(path, _applied_migrations(path))
    db = _configure(sqlite3.connect(path, timeout=BUSY_TIMEOUT_S))
    db.enable_wal()
    db.execute("PRAGMA synchronous = NORMAL")
    if MIGRATIONS.pending(db):
        with write_transaction(db):
            # Read again under the write lock: another writer may have migrated meanwhile.
            if MIGRATIONS.pending(db):
                MIGRATIONS.apply(db)
    return db


def connect_reader(path: Path, *, brief: bool = False) -> Database:
    """A read-only connection usable from any thread (Streamlit serves pages from several).

    SQLite reads a WAL store beside a writer through `-wal` and `-shm` files next to it, which
    a reader creates and, being read-only, leaves behind; in a folder it cannot write it cannot
    create them, so a long-lived reader (the app) is refused there. A `brief` reader (one
    command) of a store with no `-wal` file, so no writer at work, reads it as immutable, which
    creates and changes nothing, read-only folder or not. A writer that starts within those
    moments and checkpoints into the file could give it a torn read, never a damaged file.
    """
    if not path.exists():
        raise KilnInputError(
            f"there is no Kiln store at {path}",
            "pass --db with the store's path, or set KILN_DB",
        )
    _check_sqlite_file(path)
    idle = not path.with_name(path.name + "-wal").exists()
    if not (brief or os.access(path.parent, os.W_OK)):
        raise KilnInputError(
            f"cannot read the Kiln store {path}: its folder is read-only, and SQLite must create"
            f" {path.name}-shm beside a store in WAL mode to read it safely",
            "copy the store to a writable folder and pass that path",
        )
    applied = _applied_migrations(path)
    _check_schema(path, applied)
    if len(applied) < len(MIGRATION_NAMES):
        raise KilnInputError(
            f"{path} was written by an older Kiln and has not been upgraded yet",
            f"upgrade it once (this writes the file): python -m store --db {path} upgrade",
        )
    mode = "mode=ro&immutable=1" if brief and idle else "mode=ro"
    conn = sqlite3.connect(
        f"{path.resolve().as_uri()}?{mode}",
        uri=True,
        timeout=BUSY_TIMEOUT_S,
        check_same_thread=False,
    )
    return _configure(conn)
