"""Run: where one run's model time goes, site by site, and what the kernels did to it."""

import pandas as pd
import streamlit as st

from app_pages import queries
from app_pages.charts import amdahl_chart
from app_pages.common import kernel_url, live, ms, open_store, query_int, times
from store import Run, Site

opened = open_store()
runs = {run.id: run for run in queries.runs(opened.path, opened.version)}
chosen = query_int("run")
run_id = st.selectbox(
    "Run",
    list(reversed(runs)),
    index=list(reversed(runs)).index(chosen) if chosen in runs else 0,
    format_func=lambda ident: f"{ident}: {runs[ident].model_spec} on {runs[ident].gpu}",
)
st.query_params["run"] = str(run_id)


def model_ms(run: Run, sites: list[Site]) -> float | None:
    """The model's time per forward that the site shares are fractions of.

    The profiler times each site inside the model and gives its share of the whole, so time
    over share is that whole; the end-to-end eager time, timed apart, is only the fallback.
    """
    measured = [s.time_ms / s.share for s in sites if s.time_ms and s.share > 0]
    if measured:
        return max(measured)
    return (run.e2e or {}).get("eager_ms")


def site_rows(sites: list[Site], best: dict[int, dict]) -> pd.DataFrame:
    rows = []
    for site in sites:
        winner = best.get(site.id, {})
        rows.append(
            {
                "site": site.key,
                "family": site.family,
                "share": site.share * 100,
                "time ms": site.time_ms,
                "baseline ms": site.baseline_ms,
                "floor ms": site.floor_ms,
                "best tier": winner.get("tier"),
                "best ms": winner.get("latency_ms"),
                "speedup": winner.get("speedup"),
                "roofline": None
                if winner.get("roofline_fraction") is None
                else winner["roofline_fraction"] * 100,
                "best kernel": kernel_url(winner["id"]) if winner else None,
                "tree": f"tree?run={site.run_id}&site={site.id}",
                "signature": site.signature,
            }
        )
    return pd.DataFrame(rows)


def amdahl_parts(total: float, sites: list[Site], best: dict[int, dict]) -> pd.DataFrame:
    """Each site's time per forward before and after; a kernel replaces a site only if faster."""
    parts = []
    rest = total - sum(site.time_ms or 0.0 for site in sites)
    for order, site in enumerate(sites):
        before = site.time_ms or 0.0
        winner = best.get(site.id)
        after, note = before, "kept: no accepted kernel"
        if winner is not None and winner["latency_ms"] is not None:
            kernel = winner["latency_ms"] * site.calls
            if kernel < before:
                after, note = kernel, f"kernel {winner['id']} ({winner['tier']})"
            else:
                note = f"kept: best kernel {winner['id']} is slower"
        parts.append({"phase": "before", "part": site.key, "ms": before, "order": order,
                      "note": ""})  # fmt: skip
        parts.append({"phase": "after", "part": site.key, "ms": after, "order": order,
                      "note": note})  # fmt: skip
    for phase in ("before", "after"):
        parts.append({"phase": phase, "part": "rest of the model", "ms": max(rest, 0.0),
                      "order": len(sites), "note": "outside every site"})  # fmt: skip
    return pd.DataFrame(parts)


def render() -> None:
    store = open_store()
    run = {r.id: r for r in queries.runs(store.path, store.version)}[run_id]
    sites = queries.sites(store.path, store.version, run_id)
    best = queries.best(store.path, store.version, run_id)
    st.title(f"Run {run.id}: {run.model_spec}")
    st.caption(
        f"{run.gpu} · started {run.started_at[:19]} · status **{run.status}**"
        + (" (refreshing)" if run.status == "running" else "")
    )
    e2e = run.e2e or {}
    columns = st.columns(5)
    columns[0].metric("sites", run.sites)
    columns[1].metric("candidates", run.candidates)
    columns[2].metric("accepted", run.accepted)
    columns[3].metric("end to end vs eager", times(e2e.get("speedup_vs_eager")))
    columns[4].metric("vs torch.compile", times(e2e.get("speedup_vs_compile")))
    if not sites:
        st.info("This run has not profiled its sites yet.")
        return
    st.subheader("Sites by share of model time")
    st.dataframe(
        site_rows(sites, best),
        hide_index=True,
        column_config={
            "share": st.column_config.NumberColumn("share %", format="%.1f"),
            "speedup": st.column_config.NumberColumn(format="%.3fx"),
            "roofline": st.column_config.NumberColumn("roofline %", format="%.1f"),
            "best kernel": st.column_config.LinkColumn(display_text=r"id=(\d+)"),
            "tree": st.column_config.LinkColumn(display_text="search tree"),
        },
    )
    total = model_ms(run, sites)
    if total is None:
        st.info("No site has a measured time yet, so there is no time budget to chart.")
        return
    parts = amdahl_parts(total, sites, best)
    after = parts[parts["phase"] == "after"]["ms"].sum()
    st.subheader("Where the time went")
    st.caption(
        f"Model time {ms(total)} per forward; with each site's fastest accepted kernel in place"
        f" where it beats the site: {ms(after)} ({times(total / after if after else None)},"
        " Amdahl's estimate from the per-site times)."
    )
    st.altair_chart(amdahl_chart(parts), width="stretch")


live(render, opened.version.writing(run_id))
