"""Run: where one run's model time goes, site by site, what the kernels did to it, and where the
time of judging its candidates went."""

import statistics
from datetime import datetime

import pandas as pd
import streamlit as st

from app_pages import queries
from app_pages.charts import amdahl_chart, judging_chart
from app_pages.common import (
    kernel_url,
    live,
    ms,
    open_store,
    percent,
    query_int,
    timed_on,
    times,
)
from store import CPU_TIMINGS, Judging, Run, Site, ordered_phases

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


def judging_rows(judged: list[Judging], sites: list[Site]) -> tuple[pd.DataFrame, list[str]]:
    """Per site and phase: the median seconds a candidate spent in the phase (0 where it never
    got there), with the site's candidates judged and judged per minute of one worker's time.
    Gives the rows and the phases, in the order they run."""
    phases = ordered_phases({phase for j in judged for phase in j.phase_seconds})
    rows = []
    for site in sites:
        mine = [j for j in judged if j.site_id == site.id]
        timed = [j for j in mine if j.phase_seconds]
        if not timed:
            continue
        busy = sum(j.eval_seconds or 0.0 for j in mine)
        per_minute = 60 * len(mine) / busy if busy else None
        label = f"{site.key} · {len(mine)} judged" + (
            f" · {per_minute:.3g}/min" if per_minute else "")
        rows += [{"site": site.key, "label": label, "phase": phase, "order": order,
                  "seconds": statistics.median(j.phase_seconds.get(phase, 0.0) for j in timed),
                  "judged": len(mine), "per_minute": per_minute}
                 for order, phase in enumerate(phases)]
    return pd.DataFrame(rows), phases


def show_judging(judged: list[Judging], sites: list[Site]) -> None:
    st.subheader("Where the search's time went")
    if not judged:
        st.info("No candidate of this run has been judged yet.")
        return
    rows, phases = judging_rows(judged, sites)
    if rows.empty:
        st.info("No verdict of this run says where its judging time went (an older Kiln).")
        return
    span = datetime.fromisoformat(max(j.judged_at for j in judged)) - datetime.fromisoformat(
        min(j.proposed_at for j in judged))
    minutes = span.total_seconds() / 60
    st.caption(
        f"{len(judged)} candidates judged in {minutes:.1f} min of wall clock"
        + (f" ({len(judged) / minutes:.3g} per minute)" if minutes > 0 else "")
        + ". Per site: candidates judged and judged per minute of one evaluator worker's time.")
    st.altair_chart(judging_chart(rows, phases), width="stretch")


def of_the_floor(e2e: dict, cpu_timings: bool) -> float | None:
    """How near the model as run is to its floor; None on the CPU, whose times say nothing of a
    GPU's, or where no floor was kept."""
    floor, optimized = e2e.get("floor_ms"), e2e.get("optimized_ms")
    return None if cpu_timings or not floor or not optimized else floor / optimized


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
    e2e, cpu = run.e2e or {}, run.cpu_timings
    if run.status == "failed":
        st.error(f"This run failed {e2e.get('failure') or 'before it finished'}. What it judged "
                 "until then is below and in the store; `python -m core.optimize --resume "
                 f"{run.id}` goes on from there.")
    elif e2e.get("error"):
        st.error(f"The end-to-end check was not done: {e2e['error']}.")
    if cpu:
        st.warning(f"{CPU_TIMINGS}: this run ran on the CPU, its Triton kernels under the"
                   " interpreter; its times and speedups say nothing of a GPU's.")
    columns = st.columns(6)
    columns[0].metric("sites", run.sites)
    columns[1].metric("candidates", run.candidates)
    columns[2].metric("accepted", run.accepted)
    columns[3].metric(timed_on("end to end vs eager", cpu), times(e2e.get("speedup_vs_eager")))
    columns[4].metric(timed_on("vs torch.compile", cpu), times(e2e.get("speedup_vs_compile")))
    columns[5].metric("of the floor", percent(of_the_floor(e2e, cpu)),
                      help="The model's floor (its sites' roofline floors summed) over its time "
                           "end to end: 100% is every byte moved once at full bandwidth.")
    if not sites:
        st.info("This run has not profiled its sites yet.")
        return
    st.subheader("Sites by share of model time")
    st.dataframe(
        site_rows(sites, best),
        hide_index=True,
        column_config={
            "share": st.column_config.NumberColumn("share %", format="%.1f"),
            "speedup": st.column_config.NumberColumn(timed_on("speedup", cpu), format="%.3fx"),
            "roofline": st.column_config.NumberColumn("roofline %", format="%.1f"),
            "best kernel": st.column_config.LinkColumn(display_text=r"id=(\d+)"),
            "tree": st.column_config.LinkColumn(display_text="search tree"),
        },
    )
    show_judging(queries.judging(store.path, store.version, run_id), sites)
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
        " Amdahl's estimate from the per-site times)." + (f" {CPU_TIMINGS}." if cpu else "")
    )
    st.altair_chart(amdahl_chart(parts), width="stretch")


live(render, opened.version.writing(run_id))
