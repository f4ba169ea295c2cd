"""The Compare page: two kernels side by side and the diff between them."""

import pytest

from store import diff_candidates, open_reader
from tests.app_fixture import AppStore, app_store, open_page

__all__ = ["app_store"]


def test_two_kernels_side_by_side_with_their_diff(app_store: AppStore, monkeypatch):
    monkeypatch.setenv("KILN_DB", str(app_store.path))
    first, second = app_store.candidates[0], app_store.candidates[-1]
    with open_reader(app_store.path) as reader:
        sources = [reader.candidate(i).source.rstrip("\n") for i in (first, second)]
        diff = diff_candidates(reader, first, second).text
        same_site = (
            reader.candidate(first).summary.site_id == reader.candidate(second).summary.site_id
        )
    app = open_page("compare.py", a=first, b=second)
    shown = [code.value.rstrip("\n") for code in app.code]
    assert shown[:2] == sources
    assert shown[2] == diff.rstrip("\n")
    assert f"--- candidate {first}" in shown[2] and f"+++ candidate {second}" in shown[2]
    assert [h.value for h in app.subheader][:2] == [
        f"[Kernel {first}](kernel?id={first})",
        f"[Kernel {second}](kernel?id={second})",
    ]
    assert bool(app.warning) != same_site


def test_an_unknown_kernel_says_so(app_store: AppStore, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("KILN_DB", str(app_store.path))
    app = open_page("compare.py", a=app_store.candidates[0], b=424242)
    (error,) = app.error
    assert "there is no candidate 424242" in error.value
