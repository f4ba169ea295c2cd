"""`ast.parse` behind one lock for the whole process.

CPython 3.11 keeps the AST constructor's recursion counter per interpreter, not per thread, so
two threads parsing at once can fail with "SystemError: AST constructor recursion depth
mismatch" (python/cpython#106905). The evaluator's pool threads screen candidates at the same
time, and did fail so in a CPU test run; parsing a kernel takes about a millisecond, so taking
turns costs nothing worth measuring.
"""

from __future__ import annotations

import ast
import threading

_LOCK = threading.Lock()


def parse(source: str) -> ast.Module:
    with _LOCK:
        return ast.parse(source)
