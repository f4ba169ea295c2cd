"""A candidate's lineage: the children made from it and its ancestors up to the first draft."""

from __future__ import annotations

import pytest
from store_fixture import fill_store, triton_candidate

from core.runtime.errors import KilnInputError
from store import Store, open_reader


def test_children_and_ancestors_follow_the_parent_links(tmp_path):
    filled = fill_store(tmp_path / "kiln.db")
    with open_reader(filled.path) as store:
        assert store.children(filled.draft) == [filled.faster, filled.mismatch]
        assert store.children(filled.faster) == [filled.pending]
        assert store.children(filled.pending) == []
        assert store.ancestors(filled.pending) == [filled.faster, filled.draft]
        assert store.ancestors(filled.mismatch) == [filled.draft]
        assert store.ancestors(filled.draft) == []
        for lineage in (store.children, store.ancestors):
            with pytest.raises(KilnInputError, match="there is no candidate 999"):
                lineage(999)


def test_ancestors_of_a_long_line_come_nearest_first(tmp_path):
    filled = fill_store(tmp_path / "kiln.db")
    line = [filled.pending]
    with Store.open(filled.path) as store, store.batch():
        for step in range(1000):
            line.append(
                store.add_candidate(
                    filled.pointwise, parent_id=line[-1], tier="triton", generator="rules",
                    rationale=f"step {step}", source=triton_candidate(64) + f"# step {step}\n",
                ).id
            )  # fmt: skip
    with open_reader(filled.path) as store:
        assert store.ancestors(line[-1]) == [*reversed(line[:-1]), filled.faster, filled.draft]
        assert store.children(line[500]) == [line[501]]
