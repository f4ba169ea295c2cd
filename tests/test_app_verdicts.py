"""The app names a verdict by the store's one rule: "accepted" is correct and faster, a correct
kernel that is not faster reads "correct, slower" (not green, not a success, not an error)."""

from __future__ import annotations

import pytest

from store import VERDICTS, open_reader
from tests.app_fixture import chart_data, chart_spec, charts, open_page
from tests.store_fixture import Kinds, fill_verdict_kinds


@pytest.fixture(scope="module")
def kinds_store(tmp_path_factory: pytest.TempPathFactory) -> Kinds:
    return fill_verdict_kinds(tmp_path_factory.mktemp("kinds") / "kiln.db")


@pytest.fixture
def kinds(kinds_store: Kinds, monkeypatch: pytest.MonkeyPatch) -> Kinds:
    monkeypatch.setenv("KILN_DB", str(kinds_store.path))
    return kinds_store


BOXES = {"accepted": "success", "correct, slower": "warning", "pending": "info",
         "rejected": "error", "incorrect": "error", "compile failed": "error"}


def test_the_kernel_page_titles_and_boxes_each_verdict_by_its_label(kinds):
    for ident, label in kinds.labels.items():
        app = open_page("kernel.py", id=ident)
        assert app.title[0].value == f"Kernel {ident}: {label}"
        shown = {kind: [e.value for e in getattr(app, kind)]
                 for kind in ("success", "warning", "info", "error")}
        assert [kind for kind, values in shown.items() if values] == [BOXES[label]], (label, shown)
    slower = open_page("kernel.py", id=kinds.slower)
    assert slower.warning[0].value.startswith("Correct, slower: correct on every trial, but not")
    assert "0.8x the PyTorch reference's speed" in slower.warning[0].value
    assert any("slower: correct, but 0.80x" in text.value for text in slower.text)


def test_the_kernels_list_filters_and_names_correct_slower(kinds):
    app = open_page("kernels.py")
    verdict = app.multiselect[2]
    assert list(verdict.options) == list(VERDICTS) and "correct, slower" in verdict.options
    verdict.set_value(["correct, slower"]).run()
    rows = app.dataframe[0].value
    expected = {i for i, label in kinds.labels.items() if label == "correct, slower"}
    assert {int(url.split("=")[1]) for url in rows["kernel"]} == expected
    assert set(rows["verdict"]) == {"correct, slower"}
    verdict.set_value(["accepted"]).run()
    accepted = {int(url.split("=")[1]) for url in app.dataframe[0].value["kernel"]}
    assert accepted == {kinds.accepted, kinds.cpu_kernel}


def test_search_tree_colours_correct_slower_apart_from_accepted(kinds):
    with open_reader(kinds.path) as reader:
        site = reader.sites(kinds.gpu_run)[0]
    app = open_page("search_tree.py", run=kinds.gpu_run, site=site.id)
    progress, tree = charts(app)
    nodes = {row["id"]: row["verdict"] for row in chart_data(tree) if "depth" in row}
    assert nodes == {i: label for i, label in kinds.labels.items() if i != kinds.cpu_kernel}
    scale = chart_spec(tree)["layer"][1]["encoding"]["color"]["scale"]
    colours = dict(zip(scale["domain"], scale["range"], strict=True))
    assert colours["accepted"] == "#2e7d32"
    assert len(set(colours.values())) == len(VERDICTS), "two labels share a colour"
    # The best-so-far line follows accepted kernels only: the legacy slower kernel is faster.
    best = [row["best_so_far"] for row in chart_data(progress)]
    assert min(b for b in best if b is not None) == 0.5
    assert "1 accepted" in " ".join(c.value for c in app.caption)


def test_run_and_compare_pages_use_the_label(kinds):
    run = open_page("run.py", run=kinds.gpu_run)
    assert {m.label: m.value for m in run.metric}["accepted"] == "1"
    compare = open_page("compare.py", a=kinds.slower, b=kinds.legacy_slower)
    labels = [m.value for m in compare.markdown if m.value.startswith("**")]
    assert labels == ["**correct, slower**", "**correct, slower**"]
