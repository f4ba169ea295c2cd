"""The Search tree page: latencies in the order tried with the best so far, and the tree."""

import pytest

from store import open_reader
from tests.app_fixture import AppStore, app_store, chart_data, chart_spec, charts, open_page

__all__ = ["app_store"]


@pytest.fixture
def hottest(app_store: AppStore, monkeypatch: pytest.MonkeyPatch):
    """The page on the site with the largest share, and that site's candidates."""
    monkeypatch.setenv("KILN_DB", str(app_store.path))
    with open_reader(app_store.path) as reader:
        site = reader.sites(app_store.run)[0]
        candidates = reader.candidates(site_id=site.id)
    return open_page("search_tree.py", run=app_store.run, site=site.id), site, candidates


def test_latency_chart_has_every_candidate_in_order_and_the_best_so_far(hottest):
    app, site, candidates = hottest
    progress, _ = charts(app)
    rows = chart_data(progress)
    assert [row["id"] for row in rows] == [c.id for c in candidates]
    assert [row["order"] for row in rows] == list(range(1, len(candidates) + 1))
    best, expected = None, []
    for c in candidates:
        if c.verdict_label == "accepted":
            best = c.latency_ms if best is None else min(best, c.latency_ms)
        expected.append(best)
    assert [row["best_so_far"] for row in rows] == pytest.approx(expected)
    assert all(row["kernel"] == f"kernel?id={row['id']}" for row in rows)
    layers = chart_spec(progress)["layer"]
    assert layers[0]["encoding"]["href"]["field"] == "kernel"
    assert layers[1]["encoding"]["y"]["field"] == "best_so_far"
    assert app.title[0].value == f"Search tree of {site.key}"


def test_tree_links_each_child_to_its_parent(app_store, hottest):
    app, _, candidates = hottest
    _, tree = charts(app)
    rows = chart_data(tree)
    nodes = {row["id"]: row for row in rows if "depth" in row}
    edges = {(row["x"], row["y"], row["x2"], row["y2"]) for row in rows if "x2" in row}
    assert set(nodes) == {c.id for c in candidates}
    children = [c for c in candidates if c.parent_id is not None]
    assert children, "the hottest site has no refined kernel: the tree has no edge to check"
    for child in children:
        parent, node = nodes[child.parent_id], nodes[child.id]
        assert node["depth"] == parent["depth"] + 1
        assert (parent["depth"], parent["slot"], node["depth"], node["slot"]) in edges
        assert app_store.parents[child.id] == child.parent_id
    assert len(edges) == len(children)
    assert {row["verdict"] for row in nodes.values()} == {c.verdict_label for c in candidates}
    assert {row["tier"] for row in nodes.values()} == {c.tier for c in candidates}
    assert app.get("page_link")[0].proto.page.endswith("kernel")
