"""Overview: every run in the store, with its model, GPU, status and end-to-end speedups."""

import pandas as pd
import streamlit as st

from app_pages import queries
from app_pages.charts import runs_chart
from app_pages.common import live, open_store
from store import CPU_TIMINGS, Run

st.title("Kiln runs")
opened = open_store()
st.caption(f"Store: `{opened.path}`")


def _speedup(run: Run, against: str) -> float | None:
    """The run's end-to-end speedup; none for a CPU run, whose timings are not a headline."""
    if run.cpu_timings:
        return None
    return (run.e2e or {}).get(f"speedup_vs_{against}")


def runs_table(runs: list[Run]) -> pd.DataFrame:
    return pd.DataFrame(
        [
            {
                "run": run.id,
                "open": f"run?run={run.id}",
                "model": run.model_spec,
                "GPU": run.gpu,
                "status": run.status,
                "started": run.started_at[:19].replace("T", " "),
                "sites": run.sites,
                "candidates": run.candidates,
                "accepted": run.accepted,
                "vs eager": _speedup(run, "eager"),
                "vs torch.compile": _speedup(run, "compile"),
                "timings": CPU_TIMINGS if run.cpu_timings else "GPU",
            }
            for run in runs
        ]
    )


def render() -> None:
    store = open_store()
    runs = queries.runs(store.path, store.version)
    table = runs_table(runs)
    running = [run for run in runs if run.status == "running"]
    columns = st.columns(4)
    columns[0].metric("runs", len(runs))
    columns[1].metric("running now", len(running))
    columns[2].metric("candidates", int(table["candidates"].sum()))
    columns[3].metric("accepted", int(table["accepted"].sum()))
    latest = runs[-1]
    st.markdown(
        f"Latest: run {latest.id} of `{latest.model_spec}` on {latest.gpu}, {latest.status};"
        f" {latest.candidates} kernels tried, {latest.accepted} accepted."
    )
    for run in running:
        st.info(f"Run {run.id} ({run.model_spec}) is running: this page refreshes on its own.")
    st.dataframe(
        table,
        hide_index=True,
        column_config={
            "open": st.column_config.LinkColumn("open", display_text=r"run=(\d+)"),
            "vs eager": st.column_config.NumberColumn(format="%.3fx"),
            "vs torch.compile": st.column_config.NumberColumn(format="%.3fx"),
        },
    )
    if any(run.cpu_timings for run in runs):
        st.caption(
            f"Runs on the CPU show no speedup here ({CPU_TIMINGS}: the Triton interpreter"
            " against PyTorch on the CPU says nothing of a GPU); their Run page has them."
        )
    st.altair_chart(runs_chart(table), width="stretch")


live(render, opened.version.writing())
