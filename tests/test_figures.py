"""Measured times live in bench/NOTES.md and bench/results/, once: comments and docstrings say
why a number was chosen and point there, rather than copying a figure that then drifts."""

from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCANNED = ("core", "generators", "store", "app_pages", "app.py")
# A decimal number followed by a unit of time: "0.0679 ms", "7.5ms", "1.5 µs", "2.0 us".
MEASURED_TIME = re.compile(r"(?<![\w.])\d+\.\d+\s*(?:ms|[µμu]s)\b")


def python_files() -> list[Path]:
    files: list[Path] = []
    for name in SCANNED:
        path = ROOT / name
        files.extend([path] if path.is_file() else sorted(path.rglob("*.py")))
    return files


def comment_blocks(source: str) -> list[tuple[int, str]]:
    """(first line, text) of each run of comments on consecutive lines, so a figure wrapped
    across two comment lines is still read as one."""
    blocks: list[tuple[int, list[str]]] = []
    last = -1
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type != tokenize.COMMENT:
            continue
        line, text = token.start[0], token.string.lstrip("#").strip()
        if blocks and line == last + 1:
            blocks[-1][1].append(text)
        else:
            blocks.append((line, [text]))
        last = line
    return [(line, "\n".join(texts)) for line, texts in blocks]


def docstrings(source: str) -> list[tuple[int, str]]:
    """(first line, source text) of every string standing alone as a statement: module, class
    and function docstrings, and those under an assignment."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if (isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)
                and isinstance(node.value.value, str)):
            found.append((node.lineno, ast.get_source_segment(source, node.value) or ""))
    return found


def measured_times(source: str) -> list[tuple[int, str]]:
    """(line, text of that line) for each line with a measured time in a comment or
    docstring."""
    hits = set()
    for first, text in comment_blocks(source) + docstrings(source):
        lines = text.splitlines()
        for match in MEASURED_TIME.finditer(text):
            offset = text.count("\n", 0, match.start())
            hits.add((first + offset, lines[offset].strip()))
    return sorted(hits)


def test_the_scan_finds_times_in_comments_and_docstrings_only():
    source = '''"""Module: took 0.0679 ms on an H200."""
LIMIT_MS = 0.5  # within 100 ms, a target
# a figure wrapped across lines: 0.0951 to 0.0926
# ms on an H200
MESSAGE = f"{1.5} ms, 2.5 ms in a string"


def f():
    """18 µs against 4.25us a call."""
'''
    assert measured_times(source) == [
        (1, '"""Module: took 0.0679 ms on an H200."""'),
        (3, "a figure wrapped across lines: 0.0951 to 0.0926"),
        (9, '"""18 µs against 4.25us a call."""'),
    ]


def test_comments_and_docstrings_copy_no_measured_time():
    found = [f"{path.relative_to(ROOT)}:{line}: {text}"
             for path in python_files()
             for line, text in measured_times(path.read_text(encoding="utf-8"))]
    assert not found, (
        "Comments and docstrings copy measured times; record each in bench/NOTES.md or "
        "bench/results/ and point there instead (e.g. \"bench/NOTES.md, eighth round\"):\n"
        + "\n".join(found))
