"""Kiln's kernel store: every run, site, candidate, verdict and LLM call in one SQLite file.

The optimizer writes through `Store.open(path)`; the app and scripts read through
`open_reader(path)`, a read-only connection usable from any thread. Searches, diffs and exports
work on either; `python -m store` reads through `open_reader(path, brief=True)`.
"""

from pathlib import Path

from store.diffs import Diff, diff_candidates, diff_to_best, diff_to_parent, unified_diff
from store.export import EXPORT_FORMATS, export, export_csv, export_json, export_kernelbench
from store.labels import CPU_TIMINGS, VERDICTS, cpu_timings, verdict_label
from store.migrations import FAMILIES, RUN_STATUSES, TIERS
from store.reader import StoreReader
from store.records import (
    PHASES,
    Candidate,
    CandidateSummary,
    Judging,
    LlmCall,
    NewCandidate,
    Run,
    RunHeartbeat,
    RunState,
    Site,
    StoreVersion,
    ordered_phases,
)
from store.search import SearchFilters
from store.writer import Store, source_hash


def open_reader(path: str | Path, *, brief: bool = False) -> StoreReader:
    """A read-only store usable from any thread: the app's connection; `brief` for one command's
    reads, which works in a read-only folder as well."""
    return StoreReader.open(path, brief=brief)


__all__ = [
    "CPU_TIMINGS",
    "EXPORT_FORMATS",
    "FAMILIES",
    "PHASES",
    "RUN_STATUSES",
    "TIERS",
    "VERDICTS",
    "Candidate",
    "CandidateSummary",
    "Diff",
    "Judging",
    "LlmCall",
    "NewCandidate",
    "Run",
    "RunHeartbeat",
    "RunState",
    "SearchFilters",
    "Site",
    "Store",
    "StoreReader",
    "StoreVersion",
    "cpu_timings",
    "diff_candidates",
    "diff_to_best",
    "diff_to_parent",
    "export",
    "export_csv",
    "export_json",
    "export_kernelbench",
    "open_reader",
    "ordered_phases",
    "source_hash",
    "unified_diff",
    "verdict_label",
]
