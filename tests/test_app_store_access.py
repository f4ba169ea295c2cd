"""The app reads the store through `store/reader.py` only: no SQL and no connection of its own."""

from __future__ import annotations

import ast
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
APP_FILES = [REPO / "app.py", *sorted((REPO / "app_pages").glob("*.py"))]
DATABASE_MODULES = ("sqlite3", "sqlite_utils")
EXECUTE_CALLS = ("execute", "executemany", "executescript")
# Statement shapes in capitals, as this project writes SQL: "Select a run from the list" in a
# label is not SQL.
SQL = re.compile(
    r"\bSELECT\b.*\bFROM\b|\bINSERT\s+INTO\b|\bDELETE\s+FROM\b|\bUPDATE\s+\w+\s+SET\b"
    r"|\bCREATE\s+(TABLE|INDEX|VIEW|TRIGGER|VIRTUAL)\b|\bPRAGMA\s+\w|\bWITH\s+RECURSIVE\b"
    r"|\bJOIN\s+\w+(\s+\w+)?\s+ON\b|\bMATCH\s+[:?]",
    re.DOTALL,
)


def store_access(source: str) -> list[tuple[int, str]]:
    """(line, what) for each place `source` reaches the database without the store's reader."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Attribute):
            if node.value.attr == "db":
                found.append((node.lineno, f"the connection: .db.{node.attr}"))
        elif isinstance(node, ast.Call):
            name = getattr(node.func, "attr", getattr(node.func, "id", None))
            if name in EXECUTE_CALLS:
                found.append((node.lineno, f"a query: {name}(...)"))
        elif isinstance(node, ast.Import | ast.ImportFrom):
            modules = [alias.name for alias in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom):
                modules.append(node.module or "")
            for module in modules:
                if module.split(".")[0] in DATABASE_MODULES:
                    found.append((node.lineno, f"the database module {module}"))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            match = SQL.search(node.value)
            if match:
                found.append((node.lineno, f"SQL in a string: {match.group(0)[:60]!r}"))
    return sorted(found)


def test_app_files_hold_no_sql_and_no_connection():
    assert len(APP_FILES) > 5, f"found only {APP_FILES}"
    offences = [
        f"{path.relative_to(REPO)}:{line}: {what}"
        for path in APP_FILES
        for line, what in store_access(path.read_text())
    ]
    assert not offences, "the app must read the store through StoreReader:\n" + "\n".join(
        offences
    )


def test_the_check_finds_each_way_around_the_reader():
    source = '''import sqlite3
from sqlite_utils import Database
rows = reader.db.execute("SELECT 1")
conn.execute("x")
cursor.executemany(statement, values)
query = f"SELECT id FROM candidates WHERE parent_id = {parent}"
tree = """WITH RECURSIVE line(id) AS (SELECT 1)"""
joined = "candidates c JOIN sites s ON s.id = c.site_id"
label = "Select a run, then a site from the list below"
'''
    assert [line for line, _ in store_access(source)] == [1, 2, 3, 3, 4, 5, 6, 7, 8]
