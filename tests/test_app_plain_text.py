"""Rationales, verdict reasons and compile logs are shown as plain text: an image or a link in
one never reaches Markdown or HTML, so the browser fetches nothing."""

from __future__ import annotations

import pytest
from streamlit.testing.v1.element_tree import Block

from tests.app_fixture import open_page
from tests.store_fixture import HOSTILE_RATIONALE, HOSTILE_REASON, Kinds, fill_verdict_kinds

HOST = "example.invalid"
# Elements that show their text as written: plain text, code, tables, charts' data.
PLAIN = {"text", "code", "dataframe", "table", "vega_lite_chart", "selectbox"}


@pytest.fixture
def kinds(tmp_path, monkeypatch: pytest.MonkeyPatch) -> Kinds:
    filled = fill_verdict_kinds(tmp_path / "kiln.db")
    monkeypatch.setenv("KILN_DB", str(filled.path))
    return filled


def nodes(node):
    """Every block and element of a rendered page."""
    yield node
    if isinstance(node, Block):
        for child in node.children.values():
            yield from nodes(child)


def hostile_ones(app, text: str) -> tuple[list[str], list[str]]:
    """The types of the elements showing `text` as plain text, and of those holding the host of
    its links anywhere else (Markdown, captions, alerts, titles, labels, HTML)."""
    shown, rendered = [], []
    for node in nodes(app._tree):
        if node.type in PLAIN:
            if text in str(getattr(node, "value", "")):
                shown.append(node.type)
        elif HOST in str(getattr(node, "proto", "")):
            rendered.append(node.type)
    return shown, rendered


def pick(kinds: Kinds, label: str) -> int:
    return next(i for i, named in kinds.labels.items() if named == label)


def test_kernel_page_shows_rationale_reason_and_log_as_plain_text(kinds):
    app = open_page("kernel.py", id=pick(kinds, "rejected"))
    shown, rendered = hostile_ones(app, HOSTILE_RATIONALE)
    assert shown == ["text"] and rendered == [], (shown, rendered)
    assert any(HOSTILE_REASON in t.value for t in app.text)
    assert not any(HOST in m.value for m in app.markdown), "st.markdown was given the text"
    broken = open_page("kernel.py", id=pick(kinds, "compile failed"))
    shown, rendered = hostile_ones(broken, HOSTILE_REASON)
    assert shown == ["code"] and rendered == [], (shown, rendered)


def test_compare_page_shows_rationale_and_reason_as_plain_text(kinds):
    app = open_page("compare.py", a=pick(kinds, "rejected"), b=kinds.accepted)
    shown, rendered = hostile_ones(app, HOSTILE_REASON)
    assert shown == ["text"] and rendered == [], (shown, rendered)
    assert any(t.value == HOSTILE_RATIONALE for t in app.text)


@pytest.mark.parametrize("page", ["kernels.py", "search_tree.py"])
def test_listing_pages_keep_it_in_tables_and_charts(kinds, page):
    app = open_page(page, run=kinds.gpu_run)
    _, rendered = hostile_ones(app, HOSTILE_RATIONALE)
    assert rendered == []
