"""The Run page: sites ranked by share, each site's best kernel, and where the time went."""

import pandas as pd
import pytest

from store import open_reader
from tests.app_fixture import AppStore, app_store, chart_data, chart_spec, charts, open_page, texts
from tests.store_fixture import fill_verdict_kinds

__all__ = ["app_store"]


@pytest.fixture(params=["cpu run", "h200 run"])
def run_page(request, app_store: AppStore, tmp_path, monkeypatch: pytest.MonkeyPatch):
    """The page on the small CPU run, where a kernel beats PyTorch only by timing noise, or on a
    GPU run with an accepted kernel; the store's path, the run, the page and whether a site must
    have a best kernel."""
    if request.param == "cpu run":
        path, run = app_store.path, app_store.run
    else:
        kinds = fill_verdict_kinds(tmp_path / "kiln.db")
        path, run = kinds.path, kinds.gpu_run
    monkeypatch.setenv("KILN_DB", str(path))
    return path, run, open_page("run.py", run=run), request.param == "h200 run"


def test_sites_are_ranked_by_share_with_their_best_kernel(run_page):
    path, run, page, must_have_best = run_page
    with open_reader(path) as reader:
        sites = reader.sites(run)
        best = {c.site_id: c for c in reader.best(run)}
    rows = page.dataframe[0].value.to_dict("records")
    assert [row["site"] for row in rows] == [site.key for site in sites]
    shares = [row["share"] for row in rows]
    assert shares == sorted(shares, reverse=True)
    for site, row in zip(sites, rows, strict=True):
        assert row["share"] == pytest.approx(site.share * 100)
        winner = best.get(site.id)
        if winner is None:
            assert pd.isna(row["best kernel"])
            continue
        assert row["best tier"] == winner.tier
        assert row["best ms"] == pytest.approx(winner.latency_ms)
        assert row["speedup"] == pytest.approx(winner.speedup)
        assert row["roofline"] == pytest.approx(winner.roofline_fraction * 100)
        assert row["best kernel"] == f"kernel?id={winner.id}"
    assert best or not must_have_best, "the best-kernel columns went unchecked"


def test_amdahl_chart_holds_each_site_before_and_after(run_page):
    path, run, page, _ = run_page
    with open_reader(path) as reader:
        sites = reader.sites(run)
        best = {c.site_id: c for c in reader.best(run)}
        model = reader.run(run).model_spec
    (chart,) = [c for c in charts(page)
                if chart_spec(c).get("title") == "Where the time goes (ms per forward)"]
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
    assert f"Run {run}: {model}" in texts(page)


def test_a_failed_run_says_why_and_how_to_go_on(tmp_path, monkeypatch: pytest.MonkeyPatch):
    from store import Store

    db = tmp_path / "kiln.db"
    with Store.open(db) as store:
        run = store.start_run(model_spec="m.py", model_hash="h", gpu="cpu", versions={},
                              config={})
        store.finish_run(run, status="failed",
                         e2e={"failure": "while searching: CUDA out of memory"})
    monkeypatch.setenv("KILN_DB", str(db))
    page = open_page("run.py", run=run)
    (error,) = [e.value for e in page.error]
    assert "failed while searching: CUDA out of memory" in error
    assert f"--resume {run}" in error
