"""A site's planned kernels, made once per site problem and kept: every draft and child of the
site is the same plan under another schedule."""

from __future__ import annotations

import functools
from pathlib import Path

from generators.compiler.lower import lower_problem
from generators.compiler.program import Program, plan_program
from generators.site_graph import SiteGraph, Unsupported


@functools.lru_cache(maxsize=64)
def _planned(problem: Path, modified_ns: int, library_layout: str = ""
             ) -> Program | Unsupported:
    try:
        return plan_program(lower_problem(problem, library_layout))
    except Unsupported as reason:
        return reason


def program_of(graph: SiteGraph, library_layout: str = "") -> Program:
    """The planned kernels of the site `graph` was read from, its library calls taking their
    input in `library_layout` (`generators.compiler.library`), or Unsupported saying why
    not."""
    if graph.problem is None:
        raise Unsupported("the compiler plans kernels from a site problem file")
    found = _planned(graph.problem.resolve(), graph.problem.stat().st_mtime_ns, library_layout)
    if isinstance(found, Unsupported):
        raise found
    return found


def declined(problem: Path) -> str | None:
    """Why the compiler cannot plan the site problem at `problem`, naming the op that stopped
    it; None when it can."""
    found = _planned(problem.resolve(), problem.stat().st_mtime_ns)
    return str(found) if isinstance(found, Unsupported) else None
