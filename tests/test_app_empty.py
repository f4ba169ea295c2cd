"""An empty, missing or foreign store: every page says how to start, nothing crashes."""

from pathlib import Path

import pytest

from app_pages.common import DEFAULT_DB, db_path
from store import Store
from tests.app_fixture import open_page

PAGES = ("overview.py", "run.py", "search_tree.py", "kernels.py", "kernel.py", "compare.py",
         "export.py")  # fmt: skip


@pytest.mark.parametrize("page", PAGES)
def test_an_empty_store_shows_how_to_start_a_run(page, tmp_path, monkeypatch):
    path = tmp_path / "kiln.db"
    Store.open(path).close()
    monkeypatch.setenv("KILN_DB", str(path))
    app = open_page(page)
    (info,) = app.info
    assert "No runs in this store yet" in info.value
    assert f"python -m core.optimize examples/mlp_block.py --db {path}" in info.value
    assert not app.error and not app.dataframe


def test_a_missing_store_is_not_created(tmp_path, monkeypatch):
    path = tmp_path / "nothing-here.db"
    monkeypatch.setenv("KILN_DB", str(path))
    app = open_page("overview.py")
    (info,) = app.info
    assert f"There is no Kiln store at `{path}` yet" in info.value
    assert "python -m core.optimize" in info.value
    assert not path.exists()


def test_a_file_that_is_not_a_store_is_refused_with_a_fix(tmp_path, monkeypatch):
    path = tmp_path / "notes.db"
    path.write_text("not a database")
    monkeypatch.setenv("KILN_DB", str(path))
    app = open_page("overview.py")
    (error,) = app.error
    assert f"{path} is not a SQLite database" in error.value
    assert "Fix: pass --db with a Kiln store" in error.value


def test_db_comes_from_the_command_line_then_the_environment_then_the_default(monkeypatch):
    monkeypatch.setenv("KILN_DB", "/stores/env.db")
    assert db_path(["--db", "/stores/cli.db"]) == Path("/stores/cli.db")
    assert db_path(["--other", "x"]) == Path("/stores/env.db")
    monkeypatch.delenv("KILN_DB")
    assert db_path([]) == DEFAULT_DB == Path("kiln.db")
