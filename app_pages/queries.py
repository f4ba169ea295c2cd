"""The pages' queries, cached per store path and version (a new write makes a new version)."""

from __future__ import annotations

import io
import tempfile
import zipfile
from pathlib import Path

import pandas as pd
import streamlit as st

from app_pages.common import kernel_url, reader_for
from store import (
    Candidate,
    Diff,
    Judging,
    Run,
    SearchFilters,
    Site,
    StoreVersion,
    diff_candidates,
    diff_to_best,
    diff_to_parent,
    export,
)

# Cached results per function; a live run makes a new version every few seconds, and old
# versions are never asked for again.
MAX_VERSIONS = 16
SEARCH_LIMIT = 200


def _cache(func):
    return st.cache_data(max_entries=MAX_VERSIONS, show_spinner=False)(func)


@_cache
def runs(path: str, version: StoreVersion) -> list[Run]:
    return reader_for(path).runs()


@_cache
def sites(path: str, version: StoreVersion, run_id: int) -> list[Site]:
    return reader_for(path).sites(run_id)


@_cache
def candidate(path: str, version: StoreVersion, candidate_id: int) -> Candidate:
    return reader_for(path).candidate(candidate_id)


@_cache
def children(path: str, version: StoreVersion, candidate_id: int) -> list[int]:
    return reader_for(path).children(candidate_id)


@_cache
def ancestors(path: str, version: StoreVersion, candidate_id: int) -> list[int]:
    return reader_for(path).ancestors(candidate_id)


@_cache
def llm_call_of(path: str, version: StoreVersion, run_id: int, call_id: int) -> dict | None:
    calls = [call for call in reader_for(path).llm_calls(run_id) if call.id == call_id]
    return calls[0].to_dict() if calls else None


@_cache
def diffs(path: str, version: StoreVersion, candidate_id: int) -> tuple[Diff, Diff | None]:
    reader = reader_for(path)
    return diff_to_parent(reader, candidate_id), diff_to_best(reader, candidate_id)


@_cache
def diff_pair(path: str, version: StoreVersion, base_id: int, candidate_id: int) -> Diff:
    return diff_candidates(reader_for(path), base_id, candidate_id)


def _frame(rows: list[dict]) -> pd.DataFrame:
    frame = pd.DataFrame(rows)
    if not frame.empty:
        frame["verdict"] = [row["verdict_label"] for row in rows]
        frame["kernel"] = [kernel_url(row["id"]) for row in rows]
    return frame


@_cache
def site_candidates(path: str, version: StoreVersion, site_id: int) -> pd.DataFrame:
    """Every candidate of a site in the order tried, with its verdict in one word."""
    return _frame([c.to_dict() for c in reader_for(path).candidates(site_id=site_id)])


@_cache
def best(path: str, version: StoreVersion, run_id: int) -> dict[int, dict]:
    """The fastest accepted candidate of each site of a run, by site id."""
    return {c.site_id: c.to_dict() for c in reader_for(path).best(run_id)}


@_cache
def judging(path: str, version: StoreVersion, run_id: int) -> list[Judging]:
    return reader_for(path).judging(run_id)


@_cache
def search(
    path: str, version: StoreVersion, text: str, fts_syntax: bool, filters: SearchFilters
) -> pd.DataFrame:
    """The store's search: candidates matching the words and the filters, best matches first;
    without words, the newest candidates that pass the filters. Each with its run's GPU."""
    reader = reader_for(path)
    found = reader.search(text, fts_syntax=fts_syntax, filters=filters, limit=SEARCH_LIMIT)
    gpus = {run.id: run.gpu for run in runs(path, version)}
    return _frame([{**c.to_dict(), "snippet": c.snippet, "gpu": gpus[c.run_id]} for c in found])


@_cache
def filter_choices(path: str, version: StoreVersion) -> SearchFilters:
    """The values each filter can take in this store."""
    return reader_for(path).filter_choices()


def export_zip(path: str, fmt: str, run_id: int | None) -> bytes:
    """An export (`store.EXPORT_FORMATS`) as a zip, paths relative to the export folder."""
    with tempfile.TemporaryDirectory() as folder:
        out = Path(folder)
        written = export(reader_for(path), fmt, out, run_id)
        buffer = io.BytesIO()
        with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
            for file in written:
                archive.write(file, file.relative_to(out))
        return buffer.getvalue()
