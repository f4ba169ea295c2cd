"""A run on the CPU: its timings are indicative, never a headline; GPU runs are shown as before."""

from __future__ import annotations

import re

import pytest

from store import CPU_TIMINGS
from tests.app_fixture import chart_data, charts, open_page, texts
from tests.store_fixture import Kinds, fill_verdict_kinds


@pytest.fixture(scope="module")
def kinds_store(tmp_path_factory: pytest.TempPathFactory) -> Kinds:
    return fill_verdict_kinds(tmp_path_factory.mktemp("cpu-runs") / "kiln.db")


@pytest.fixture
def kinds(kinds_store: Kinds, monkeypatch: pytest.MonkeyPatch) -> Kinds:
    monkeypatch.setenv("KILN_DB", str(kinds_store.path))
    return kinds_store


def test_overview_does_not_headline_a_cpu_speedup(kinds):
    app = open_page("overview.py")
    table = app.dataframe[0].value.set_index("run")
    assert table.loc[kinds.cpu_run, "GPU"] == "cpu"
    assert table.loc[kinds.cpu_run, "timings"] == CPU_TIMINGS
    assert table.loc[[kinds.cpu_run], ["vs eager", "vs torch.compile"]].isna().all(axis=None)
    assert (table.loc[kinds.gpu_run, "vs eager"], table.loc[kinds.gpu_run, "timings"]) == (1.8,
                                                                                          "GPU")
    (chart,) = charts(app)
    speedups = {(r["run"], r["baseline"]) for r in chart_data(chart) if "baseline" in r}
    assert speedups == {(kinds.gpu_run, "vs eager"), (kinds.gpu_run, "vs torch.compile")}
    shown = texts(app) + " ".join(f"{m.label} {m.value}" for m in app.metric)
    assert not re.search(r"\b47(?:\.\d+)?x", shown), shown  # the CPU run's 47x (not a path's 47)
    assert CPU_TIMINGS in " ".join(c.value for c in app.caption)


def test_run_page_labels_cpu_speedups(kinds):
    app = open_page("run.py", run=kinds.cpu_run)
    assert app.warning[0].value.startswith(CPU_TIMINGS)
    metrics = {m.label: m.value for m in app.metric}
    assert metrics[f"end to end vs eager ({CPU_TIMINGS})"] == "47x"
    assert metrics[f"vs torch.compile ({CPU_TIMINGS})"] == "3x"
    assert metrics["of the floor"] == "–", "a CPU time set against a GPU's floor"
    gpu = open_page("run.py", run=kinds.gpu_run)
    assert not gpu.warning and CPU_TIMINGS not in texts(gpu)
    gpu_metrics = {m.label: m.value for m in gpu.metric}
    assert gpu_metrics["end to end vs eager"] == "1.8x"
    assert gpu_metrics["of the floor"] == "75.0%"


def test_kernel_page_labels_cpu_speedups(kinds):
    app = open_page("kernel.py", id=kinds.cpu_kernel)
    labels = {m.label for m in app.metric}
    assert {f"speedup ({CPU_TIMINGS})", f"vs eager ({CPU_TIMINGS})"} <= labels
    assert app.success[0].value.endswith(f"2x the PyTorch reference's speed ({CPU_TIMINGS}).")
    gpu = open_page("kernel.py", id=kinds.accepted)
    assert "speedup" in {m.label for m in gpu.metric} and CPU_TIMINGS not in texts(gpu)
