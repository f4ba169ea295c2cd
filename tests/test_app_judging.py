"""Where judging time went: each kernel's seconds per phase and peak device memory, and per site
of a run the median seconds per phase, candidates judged and judged per worker-minute."""

from __future__ import annotations

import statistics

import pytest

from store import PHASES, open_reader
from tests.app_fixture import AppStore, app_store, chart_data, chart_spec, charts, open_page
from tests.store_fixture import PHASE_SECONDS, Kinds, fill_verdict_kinds

__all__ = ["app_store"]


@pytest.fixture
def kinds(tmp_path, monkeypatch: pytest.MonkeyPatch) -> Kinds:
    filled = fill_verdict_kinds(tmp_path / "kiln.db")
    monkeypatch.setenv("KILN_DB", str(filled.path))
    return filled


def chart_titled(app, title: str):
    (chart,) = [c for c in charts(app) if chart_spec(c).get("title") == title]
    return chart


def test_kernel_page_charts_its_phases_in_order_and_its_peak_memory(kinds):
    app = open_page("kernel.py", id=kinds.accepted)
    rows = chart_data(chart_titled(app, "Seconds in each phase of judging"))
    assert [(row["phase"], row["seconds"]) for row in rows] == list(PHASE_SECONDS.items())
    assert list(PHASE_SECONDS) == list(PHASES)
    captions = " ".join(c.value for c in app.caption)
    assert f"Judged in {sum(PHASE_SECONDS.values()):.3g} s" in captions
    assert {m.label: m.value for m in app.metric}["peak device memory"] == "3,072.0 MiB"


def test_kernel_page_without_phases_or_memory_says_so(kinds):
    app = open_page("kernel.py", id=kinds.legacy_slower)
    assert not [c for c in charts(app) if "phase" in str(chart_spec(c).get("title"))]
    assert "does not say where that time went" in " ".join(c.value for c in app.caption)
    assert "peak device memory" not in {m.label for m in app.metric}


def test_run_page_stacks_median_phase_seconds_per_site(app_store: AppStore, monkeypatch):
    monkeypatch.setenv("KILN_DB", str(app_store.path))
    with open_reader(app_store.path) as reader:
        sites = reader.sites(app_store.run)
        verdicts = {site.id: [reader.candidate(c.id).verdict for c in
                              reader.candidates(site_id=site.id) if c.accepted is not None]
                    for site in sites}
    app = open_page("run.py", run=app_store.run)
    chart = chart_titled(app, "Median seconds per candidate, by phase of judging")
    rows = chart_data(chart)
    assert [row["site"] for row in rows[:: len(rows) // len(sites)]] == [s.key for s in sites]
    phases = [p for p in PHASES if any(p in v["phase_seconds"] for vs in verdicts.values()
                                       for v in vs)]
    assert {"compile", "checks", "timing"} <= set(phases)
    for site in sites:
        mine = [row for row in rows if row["site"] == site.key]
        assert [row["phase"] for row in mine] == phases
        judged = verdicts[site.id]
        # A verdict that does not say where its time went (a CUDA kernel the CPU cannot run)
        # counts as judged, and stays out of the medians.
        broken_down = [v["phase_seconds"] for v in judged if v["phase_seconds"]]
        for row in mine:
            expected = statistics.median(spent.get(row["phase"], 0.0) for spent in broken_down)
            assert row["seconds"] == pytest.approx(expected)
            assert row["judged"] == len(judged)
            busy = sum(v["eval_seconds"] for v in judged)
            assert row["per_minute"] == pytest.approx(60 * len(judged) / busy)
    spec = chart_spec(chart)
    assert spec["encoding"]["x"]["stack"] == "zero"
    assert spec["encoding"]["color"]["sort"] == phases
    total = sum(len(v) for v in verdicts.values())
    assert f"{total} candidates judged in" in " ".join(c.value for c in app.caption)
