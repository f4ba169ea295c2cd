"""Unified diffs of a candidate against its parent, its site's best, or any other candidate."""

from __future__ import annotations

import difflib
from dataclasses import asdict, dataclass
from typing import Any

from store.reader import StoreReader


@dataclass(frozen=True)
class Diff:
    """`base_id` None means the base is the site's PyTorch reference (its problem file)."""

    base_id: int | None
    base_label: str
    candidate_id: int
    text: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def unified_diff(old: str, new: str, old_label: str, new_label: str) -> str:
    lines = difflib.unified_diff(
        old.splitlines(keepends=True),
        new.splitlines(keepends=True),
        fromfile=old_label,
        tofile=new_label,
    )
    # A file without a final newline would otherwise run its last line into the next header.
    return "".join(line if line.endswith("\n") else line + "\n" for line in lines)


def _label(candidate_id: int) -> str:
    return f"candidate {candidate_id}"


def diff_candidates(store: StoreReader, base_id: int, candidate_id: int) -> Diff:
    base, candidate = store.candidate(base_id), store.candidate(candidate_id)
    text = unified_diff(base.source, candidate.source, _label(base_id), _label(candidate_id))
    return Diff(base_id, _label(base_id), candidate_id, text)


def diff_to_parent(store: StoreReader, candidate_id: int) -> Diff:
    """Against the parent candidate, or against the reference for a first draft."""
    candidate = store.candidate(candidate_id)
    parent_id = candidate.summary.parent_id
    if parent_id is not None:
        return diff_candidates(store, parent_id, candidate_id)
    site = store.site(candidate.summary.site_id)
    label = f"site {site.key} reference"
    text = unified_diff(site.problem_source, candidate.source, label, _label(candidate_id))
    return Diff(None, label, candidate_id, text)


def diff_to_best(store: StoreReader, candidate_id: int) -> Diff | None:
    """Against the fastest accepted candidate of its site; None while the site has none."""
    best = store.best_of_site(store.candidate(candidate_id).summary.site_id)
    return None if best is None else diff_candidates(store, best.id, candidate_id)
