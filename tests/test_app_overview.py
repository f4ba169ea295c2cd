"""The Overview page: every run with its model, GPU, status, counts and end-to-end speedups."""

import random

import pytest

from bench.store_bench import fill
from store import CPU_TIMINGS, Store, open_reader
from tests.app_fixture import AppStore, app_store, chart_data, chart_spec, charts, open_page

__all__ = ["app_store"]


@pytest.fixture
def overview(app_store: AppStore, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("KILN_DB", str(app_store.path))
    return open_page("overview.py")


def test_lists_the_run_with_its_model_gpu_status_and_counts(app_store, overview):
    (table,) = overview.dataframe
    rows = table.value.to_dict("records")
    with open_reader(app_store.path) as reader:
        run = reader.run(app_store.run)
    assert [row["run"] for row in rows] == [app_store.run]
    row = rows[0]
    assert row["model"] == "mlp_block_small.py"
    assert (row["GPU"], row["timings"]) == (run.gpu, CPU_TIMINGS) and run.gpu == "cpu"
    assert row["status"] == "done"
    assert (row["sites"], row["candidates"], row["accepted"]) == (
        run.sites, run.candidates, run.accepted
    )  # fmt: skip
    assert row["candidates"] == len(app_store.candidates)
    assert row["open"] == f"run?run={app_store.run}"
    metrics = {m.label: m.value for m in overview.metric}
    assert metrics["candidates"] == str(run.candidates)
    assert metrics["running now"] == "0"


def test_chart_carries_each_runs_counts(app_store, overview):
    (chart,) = charts(overview)
    rows = chart_data(chart)
    with open_reader(app_store.path) as reader:
        run = reader.run(app_store.run)
    counts = {row["kind"]: row["count"] for row in rows if row["run"] == app_store.run}
    assert counts == {"candidates": run.candidates, "accepted": run.accepted}
    assert chart_spec(chart)["encoding"]["x"]["field"] == "run"


def test_end_to_end_speedups_are_charted_across_runs(tmp_path, monkeypatch):
    path = tmp_path / "runs.db"
    with Store.open(path) as store:
        fill(store, 200, random.Random(0))
        run = store.start_run(
            model_spec="examples/mlp_block.py", model_hash="1", gpu="NVIDIA H200",
            versions={}, config={},
        )  # fmt: skip
        store.finish_run(run, e2e={"speedup_vs_eager": 1.8, "speedup_vs_compile": 1.1})
    monkeypatch.setenv("KILN_DB", str(path))
    app = open_page("overview.py")
    table = app.dataframe[0].value
    assert len(table) == run
    assert table.set_index("run").loc[run, "vs torch.compile"] == 1.1
    (chart,) = charts(app)
    speedups = {
        (row["run"], row["baseline"]): row["speedup"]
        for row in chart_data(chart)
        if "baseline" in row
    }
    assert speedups[(run, "vs eager")] == 1.8
    assert speedups[(run, "vs torch.compile")] == 1.1
    assert speedups[(1, "vs eager")] == 1.2
    assert (1, "vs torch.compile") not in speedups
