"""Compare: any two kernels side by side, with the diff between them."""

import streamlit as st

from app_pages import queries
from app_pages.common import ms, open_store, percent, query_int, timed_on, times
from core.runtime.errors import KilnInputError
from store import Candidate, cpu_timings

st.title("Compare two kernels")
store = open_store()
left, right = st.columns(2)
first = left.number_input("Kernel", min_value=1, step=1, value=query_int("a") or 1)
second = right.number_input("against kernel", min_value=1, step=1, value=query_int("b") or 2)
st.query_params.update({"a": str(first), "b": str(second)})
try:
    kernels = [queries.candidate(store.path, store.version, int(i)) for i in (first, second)]
except KilnInputError as err:
    st.error(f"{err.problem}\n\nFix: {err.fix}")
    st.stop()


gpus = {run.id: run.gpu for run in queries.runs(store.path, store.version)}


def describe(column, kernel: Candidate) -> None:
    s = kernel.summary
    column.subheader(f"[Kernel {kernel.id}](kernel?id={kernel.id})")
    column.caption(f"{s.tier} · {s.generator} · site `{s.site_key}` · run {s.run_id}")
    column.markdown(f"**{s.verdict_label}**")
    # A generator's rationale and a verdict's reason, as plain text: never Markdown or HTML.
    column.text(s.rationale)
    if s.reason:
        column.text(s.reason)
    metrics = column.columns(3)
    metrics[0].metric("latency", ms(s.latency_ms))
    metrics[1].metric(timed_on("speedup", cpu_timings(gpus[s.run_id])), times(s.speedup))
    metrics[2].metric("roofline", percent(s.roofline_fraction))
    column.code(kernel.source, language="python", line_numbers=True)


for column, kernel in zip(st.columns(2), kernels, strict=True):
    describe(column, kernel)
if kernels[0].summary.site_id != kernels[1].summary.site_id:
    st.warning("These kernels are for different sites: their timings are not comparable.")
diff = queries.diff_pair(store.path, store.version, int(first), int(second))
st.subheader(f"Diff: kernel {first} → kernel {second}")
st.code(diff.text or "(identical sources)", language="diff")
