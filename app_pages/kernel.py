"""Kernel: one candidate's source, verdict, errors, timings, where its judging time went, lineage
and diffs."""

import pandas as pd
import streamlit as st

from app_pages import queries
from app_pages.charts import phase_chart
from app_pages.common import (
    PAGE_KERNEL,
    PAGE_TREE,
    mebibytes,
    ms,
    open_store,
    percent,
    query_int,
    seconds,
    timed_on,
    times,
)
from core.evaluate.counters import CounterReport
from core.runtime.errors import KilnInputError
from store import CPU_TIMINGS, ordered_phases
from store.labels import ACCEPTED, COMPILE_FAILED, INCORRECT, PENDING, REJECTED, SLOWER

# Links shown each way along the lineage; a long refinement chain is summarised past them.
LINEAGE_SHOWN = 12
NOT_ACCEPTED = {
    REJECTED: "Rejected: correct, but not accepted",
    INCORRECT: "Incorrect: not correct on every trial",
    COMPILE_FAILED: "Compile failed: it did not build or load",
}

store = open_store()
ident = st.number_input("Kernel id", min_value=1, step=1, value=query_int("id") or 1)
st.query_params["id"] = str(ident)
try:
    kernel = queries.candidate(store.path, store.version, int(ident))
except KilnInputError as err:
    st.error(f"{err.problem}\n\nFix: {err.fix}")
    st.stop()
summary, verdict = kernel.summary, kernel.verdict or {}
site = {s.id: s for s in queries.sites(store.path, store.version, summary.run_id)}[summary.site_id]
run = {r.id: r for r in queries.runs(store.path, store.version)}[summary.run_id]
label = summary.verdict_label

st.title(f"Kernel {kernel.id}: {label}")
st.caption(
    f"{summary.tier} · {summary.generator} · site `{summary.site_key}` ({summary.family},"
    f" {site.share * 100:.1f}% of model time) · run {summary.run_id} · {summary.created_at[:19]}"
)
# Rationales, reasons and logs come from a generator or a kernel's own output: shown as plain
# text, so an image or a link in them makes the browser fetch nothing.
st.text(f"Rationale: {summary.rationale}")
speed = "" if summary.speedup is None else (
    f": {times(summary.speedup)} the PyTorch reference's speed"
    + (f" ({CPU_TIMINGS})" if run.cpu_timings else ""))
if label == ACCEPTED:
    st.success(f"Accepted: correct on every trial, and faster{speed}.")
elif label == SLOWER:
    st.warning(f"Correct, slower: correct on every trial, but not faster{speed}.")
elif label == PENDING:
    st.info("No verdict yet: the evaluator has not finished with this kernel.")
else:
    st.error(f"{NOT_ACCEPTED[label]}.")
if label in NOT_ACCEPTED or (label == SLOWER and summary.reason):
    st.text(f"{verdict.get('reason_code') or 'no code'}: {summary.reason or 'no reason given'}")
if verdict.get("compile_log"):
    with st.expander("Compile and run log", expanded=not summary.compiled):
        st.code(verdict["compile_log"], language="text")

timing, checks = st.columns(2)
with timing:
    st.subheader("Timing")
    st.caption(
        f"{verdict.get('timing_trials') or 0} trials on {verdict.get('timing_device') or '–'}"
        + (f": {CPU_TIMINGS}" if run.cpu_timings else "")
    )
    row = st.columns(3)
    row[0].metric("median", ms(verdict.get("latency_ms")))
    row[1].metric("baseline", ms(verdict.get("baseline_ms")))
    row[2].metric(timed_on("speedup", run.cpu_timings), times(summary.speedup))
    row = st.columns(3)
    row[0].metric(timed_on("vs eager", run.cpu_timings), times(summary.speedup_vs_eager))
    row[1].metric(timed_on("vs torch.compile", run.cpu_timings),
                  times(summary.speedup_vs_compile))
    row[2].metric("roofline", percent(summary.roofline_fraction))
    st.table(
        {
            "mean": [ms(verdict.get("latency_mean_ms"))],
            "min": [ms(verdict.get("latency_min_ms"))],
            "max": [ms(verdict.get("latency_max_ms"))],
            "stdev": [ms(verdict.get("latency_stdev_ms"))],
        }
    )
    phases = verdict.get("phase_seconds") or {}
    if verdict:
        st.caption(f"Judged in {seconds(verdict.get('eval_seconds'))}"
                   + ("" if phases else "; this verdict does not say where that time went"))
    if phases:
        order = ordered_phases(phases)
        st.altair_chart(phase_chart(pd.DataFrame(
            {"phase": order, "seconds": [phases[p] for p in order]})), width="stretch")
    if verdict.get("peak_memory_bytes") is not None:
        st.metric("peak device memory", mebibytes(verdict["peak_memory_bytes"]))
with checks:
    st.subheader("Correctness")
    st.table(
        {
            "check": ["compiled", "correct", "max abs error", "max rel error", "tolerance",
                      "trials", "kernel launches", "library ops", "flagged"],
            "value": [
                str(summary.compiled), str(summary.correct), str(verdict.get("max_abs_err")),
                str(verdict.get("max_rel_err")),
                f"{verdict.get('tolerance')} ({verdict.get('tolerance_name') or '–'})",
                ", ".join(verdict.get("trials_checked") or []) or "–",
                str(verdict.get("kernel_launches")),
                ", ".join(verdict.get("library_ops") or []) or "none",
                str(verdict.get("flagged", False)),
            ],
        }
    )  # fmt: skip

st.subheader("Why it is slow")
st.text(f"Diagnosis: {verdict.get('diagnosis') or 'none: nothing the rules could tell'}")
report = verdict.get("kernel_report") or {}
if report.get("kernels"):
    st.table({name: [kernel.get(key) for kernel in report["kernels"]] for name, key in (
        ("kernel", "name"), ("registers", "registers"), ("spill stores B", "spill_store_bytes"),
        ("spill loads B", "spill_load_bytes"), ("stack B", "stack_bytes"),
        ("shared B", "shared_bytes"), ("threads", "threads"), ("16-byte loads", "wide_loads"),
        ("narrower loads", "narrow_loads"))} | {
        "matrix ops": [", ".join(k.get("matrix_ops") or []) or "none" for k in report["kernels"]]})
    sources = {f"{figure}: {where}" for k in report["kernels"]
               for figure, where in (k.get("sources") or {}).items()}
    st.caption("Read from " + "; ".join(sorted(sources)))
for note in report.get("notes", []):
    st.caption(note)
counters = CounterReport.from_dict(verdict["counters"]) if verdict.get("counters") else None
if counters is not None:
    st.markdown("**Hardware counters** (Nsight Compute, one forward, clocks left alone)")
    if counters.kernels:
        st.table({name: [figure(kernel) for kernel in counters.kernels] for name, figure in (
            ("kernel", lambda k: k.name), ("µs", lambda k: (k.duration_ns or 0) / 1e3),
            ("DRAM % peak", lambda k: k.dram_pct), ("SM % peak", lambda k: k.sm_pct),
            ("achieved occupancy %", lambda k: k.achieved_occupancy_pct),
            ("theoretical occupancy %", lambda k: k.theoretical_occupancy_pct),
            ("L2 hit %", lambda k: k.l2_hit_pct), ("sector use %", lambda k: k.sector_use_pct),
            ("top stalls", lambda k: ", ".join(f"{reason} {share:.0%}"
                                               for reason, share in k.top_stalls(3))))})
        longest = counters.dominant
        if longest is not None and longest.stalls:
            st.caption(f"What the warps of {longest.name} wait on, as a share of all stalls")
            st.bar_chart({"share of stalls": dict(longest.top_stalls(8))}, horizontal=True)
        st.caption(f"Collected in {counters.seconds:.1f} s")
    for note in counters.notes:
        st.caption(note)

st.subheader("Lineage")
ancestors = queries.ancestors(store.path, store.version, kernel.id)
if ancestors:
    shown = " ← ".join(f"[{a}](kernel?id={a})" for a in ancestors[:LINEAGE_SHOWN])
    more = len(ancestors) - LINEAGE_SHOWN
    st.markdown(f"Descends from {shown}" + (f" ← … {more} more" if more > 0 else ""))
else:
    st.markdown("A first draft: no parent.")
kids = queries.children(store.path, store.version, kernel.id)
if kids:
    shown = ", ".join(f"[{k}](kernel?id={k})" for k in kids[:LINEAGE_SHOWN])
    more = len(kids) - LINEAGE_SHOWN
    st.markdown(f"Children: {shown}" + (f", … {more} more" if more > 0 else ""))
st.page_link(
    PAGE_TREE,
    label="This site's search tree",
    query_params={"run": str(summary.run_id), "site": str(summary.site_id)},
)

source, to_parent, to_best, problem = st.tabs(
    ["Source", "Diff against parent", "Diff against the site's best", "Site problem"]
)
source.code(kernel.source, language="python", line_numbers=True)
against_parent, against_best = queries.diffs(store.path, store.version, kernel.id)
to_parent.caption(f"Against {against_parent.base_label}")
to_parent.code(against_parent.text or "(identical)", language="diff")
if against_best is None:
    to_best.info("This site has no accepted kernel yet.")
elif against_best.base_id == kernel.id:
    to_best.success("This is the site's best kernel.")
else:
    to_best.caption(f"Against {against_best.base_label}, the site's fastest accepted kernel")
    to_best.code(against_best.text or "(identical)", language="diff")
    to_best.page_link(PAGE_KERNEL, label=f"Open kernel {against_best.base_id}",
                      query_params={"id": str(against_best.base_id)})  # fmt: skip
problem.code(site.problem_source, language="python")
if kernel.llm_call_id is not None:
    call = queries.llm_call_of(store.path, store.version, summary.run_id, kernel.llm_call_id)
    if call is not None:
        with st.expander(f"LLM call {call['id']} ({call['model']})"):
            st.caption(
                f"{call['prompt_tokens']} prompt + {call['completion_tokens']} completion tokens,"
                f" {ms(call['latency_ms'])}, ${call['cost_usd'] or 0:.4f}"
            )
            st.code(call["prompt"], language="markdown")
            st.code(call["reply"] or call["error"] or "", language="markdown")
