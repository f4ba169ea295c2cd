"""Bad input: one clear message, exit code 2, and the store's folder exactly as it was."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
from store_fixture import fill_store, read_only, run_cli

from core.runtime.errors import KilnInputError
from store import Store, open_reader


def snapshot(folder: Path) -> dict[str, bytes]:
    return {path.name: path.read_bytes() for path in sorted(folder.iterdir())}


def assert_refused(folder: Path, args: list[str], message: str) -> None:
    before = snapshot(folder)
    result = run_cli(*args)
    assert result.returncode == 2, f"exit {result.returncode}\n{result.stdout}{result.stderr}"
    assert result.stderr.startswith("kiln: error: "), result.stderr
    assert message in result.stderr, result.stderr
    assert "fix: " in result.stderr and "Traceback" not in result.stderr, result.stderr
    assert snapshot(folder) == before, "the refused store's folder changed"


def test_a_file_that_is_not_sqlite(tmp_path):
    path = tmp_path / "notes.db"
    path.write_text("kernel ideas:\n- fuse the softmax\n")
    assert_refused(tmp_path, ["--db", str(path), "runs"], "is not a SQLite database")
    with pytest.raises(KilnInputError, match="is not a SQLite database"):
        Store.open(path)


def test_a_sqlite_database_that_is_not_a_store(tmp_path):
    path = tmp_path / "other.db"
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE notes (text TEXT)")
    conn.close()
    assert_refused(tmp_path, ["--db", str(path), "runs"], "is a SQLite database but not a Kiln")


def test_a_store_from_a_newer_schema(tmp_path):
    filled = fill_store(tmp_path / "kiln.db")
    with sqlite3.connect(filled.path) as conn:
        conn.execute(
            "INSERT INTO _sqlite_migrations (migration_set, name, applied_at)"
            " VALUES ('kiln-store', 'm003_from_the_future', '2027-01-01')"
        )
    conn.close()
    args = ["--db", str(filled.path), "candidates"]
    assert_refused(tmp_path, args, "written by a newer Kiln")
    assert "m003_from_the_future" in run_cli(*args).stderr
    for opener in (Store.open, open_reader):
        with pytest.raises(KilnInputError, match="newer Kiln"):
            opener(filled.path)


def test_a_store_in_a_read_only_location(tmp_path):
    folder = tmp_path / "shared"
    folder.mkdir()
    filled = fill_store(folder / "kiln.db")
    with read_only(filled.path, folder):
        assert_refused(folder, ["--db", str(filled.path), "upgrade"], f"{folder} is read-only")
        with pytest.raises(KilnInputError, match="its folder is read-only"):
            open_reader(filled.path)
        with pytest.raises(KilnInputError, match="is read-only"):
            Store.open(folder / "new.db")
    with read_only(filled.path):
        assert_refused(
            folder, ["--db", str(filled.path), "upgrade"], f"{filled.path} is read-only"
        )


def test_an_export_into_a_read_only_folder(tmp_path):
    filled = fill_store(tmp_path / "kiln.db")
    out = tmp_path / "out"
    out.mkdir()
    with read_only(out):
        for fmt in ("kernelbench", "json", "csv"):
            result = run_cli("--db", str(filled.path), "export", "--format", fmt, "--out", str(out))
            assert result.returncode == 2, result.stderr
            assert f"kiln: error: cannot write {out}" in result.stderr
    assert list(out.iterdir()) == []


def test_a_query_that_is_not_valid_fts_syntax(tmp_path):
    filled = fill_store(tmp_path / "kiln.db")
    args = ["--db", str(filled.path), "search", "--fts", "softmax AND (row"]
    assert_refused(tmp_path, args, "is not valid full-text search syntax")


def test_a_missing_store_is_not_created_by_the_cli(tmp_path):
    path = tmp_path / "typo.db"
    assert_refused(tmp_path, ["--db", str(path), "runs"], f"there is no Kiln store at {path}")
    result = run_cli("runs", env={"KILN_DB": str(path)})
    assert result.returncode == 2 and str(path) in result.stderr, result.stderr


def test_ids_that_do_not_exist(tmp_path):
    filled = fill_store(tmp_path / "kiln.db")
    db = ["--db", str(filled.path)]
    assert_refused(tmp_path, [*db, "show", "999"], "there is no candidate 999")
    assert_refused(tmp_path, [*db, "candidates", "--run", "7"], "there is no run 7")
    assert_refused(tmp_path, [*db, "candidates", "--site", "7"], "there is no site 7")
    assert_refused(tmp_path, [*db, "diff", "1", "999"], "there is no candidate 999")


def test_site_keys_that_do_not_exist(tmp_path):
    filled = fill_store(tmp_path / "kiln.db")
    db = ["--db", str(filled.path)]
    assert_refused(
        tmp_path, [*db, "candidates", "--site", "reduction-1eccd0f77a"],
        f"there is no site reduction-1eccd0f77a in {filled.path}",
    )  # fmt: skip
    with Store.open(filled.path) as store:
        newer = store.start_run(
            model_spec="b.py", model_hash="2", gpu="H200", versions={}, config={}
        )
    assert_refused(
        tmp_path, [*db, "candidates", "--site", "reduction-5e6f7a8b", "--run", str(newer)],
        f"run {newer} has no site reduction-5e6f7a8b (runs with it: {filled.run})",
    )  # fmt: skip
