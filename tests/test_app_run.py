"""The Run page: sites ranked by share, each site's best kernel, and where the time went."""

import pytest

from store import open_reader
from tests.app_fixture import AppStore, app_store, chart_data, charts, open_page, texts

__all__ = ["app_store"]


@pytest.fixture
def run_page(app_store: AppStore, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("KILN_DB", str(app_store.path))
    return open_page("run.py", run=app_store.run)


def test_sites_are_ranked_by_share_with_their_best_kernel(app_store, run_page):
    with open_reader(app_store.path) as reader:
        sites = reader.sites(app_store.run)
        best = {c.site_id: c for c in reader.best(app_store.run)}
    rows = run_page.dataframe[0].value.to_dict("records")
    assert [row["site"] for row in rows] == [site.key for site in sites]
    assert set(app_store.sites) == {row["site"] for row in rows}
    shares = [row["share"] for row in rows]
    assert shares == sorted(shares, reverse=True)
    for site, row in zip(sites, rows, strict=True):
        assert row["share"] == pytest.approx(site.share * 100)
        winner = best.get(site.id)
        if winner is None:
            assert row["best kernel"] is None
            continue
        assert row["best tier"] == winner.tier
        assert row["best ms"] == pytest.approx(winner.latency_ms)
        assert row["speedup"] == pytest.approx(winner.speedup)
        assert row["roofline"] == pytest.approx(winner.roofline_fraction * 100)
        assert row["best kernel"] == f"kernel?id={winner.id}"
    assert best, "the small run accepted no kernel: the best-kernel columns went unchecked"


def test_amdahl_chart_holds_each_site_before_and_after(app_store, run_page):
    with open_reader(app_store.path) as reader:
        sites = reader.sites(app_store.run)
        best = {c.site_id: c for c in reader.best(app_store.run)}
    (chart,) = charts(run_page)
    rows = chart_data(chart)
    before = {row["part"]: row["ms"] for row in rows if row["phase"] == "before"}
    after = {row["part"]: row["ms"] for row in rows if row["phase"] == "after"}
    assert sum(before.values()) == pytest.approx(sites[0].time_ms / sites[0].share)
    for site in sites:
        assert before[site.key] == pytest.approx(site.time_ms)
        winner = best.get(site.id)
        kernel_ms = None if winner is None else winner.latency_ms * site.calls
        expected = site.time_ms if kernel_ms is None else min(kernel_ms, site.time_ms)
        assert after[site.key] == pytest.approx(expected)
    assert before["rest of the model"] == after["rest of the model"]
    assert f"Run {app_store.run}: mlp_block_small.py" in texts(run_page)
