"""Kernels: full-text search over every candidate, narrowed by tier, generator, verdict and more."""

import streamlit as st

from app_pages import queries
from app_pages.common import open_store
from core.runtime.errors import KilnInputError
from store import SearchFilters

st.title("Kernels")
store = open_store()
choices = queries.filter_choices(store.path, store.version)
text = st.text_input(
    "Search source, rationale, site signature and ops, and rejection reasons",
    value=st.query_params.get("q", ""),
    placeholder="e.g. tl.sum, wrong_values, layer_norm, num_warps",
    help="Every word must match, each as the start of a word: warp finds warps.",
)
fts_syntax = st.toggle(
    "Full-text search syntax",
    help='SQLite FTS5: AND / OR / NOT, "phrases", prefix*, column filters such as reason:compile*',
)
columns = st.columns(6)
filters = SearchFilters(
    tiers=tuple(columns[0].multiselect("Tier", choices.tiers)),
    generators=tuple(columns[1].multiselect("Generator", choices.generators)),
    verdicts=tuple(columns[2].multiselect("Verdict", choices.verdicts)),
    families=tuple(columns[3].multiselect("Family", choices.families)),
    gpus=tuple(columns[4].multiselect("GPU", choices.gpus)),
    runs=tuple(columns[5].multiselect("Run", choices.runs)),
)
if text:
    st.query_params["q"] = text
try:
    found = queries.search(store.path, store.version, text, fts_syntax, filters)
except KilnInputError as err:
    st.error(f"{err.problem}\n\nFix: {err.fix}")
    st.stop()
if found.empty:
    st.info("No kernel matches." if text or filters != SearchFilters() else "No kernels yet.")
    st.stop()
shown = "best matches first" if text else "newest first"
st.caption(f"{len(found)} kernels shown ({shown}, at most {queries.SEARCH_LIMIT}).")
st.dataframe(
    found,
    hide_index=True,
    column_order=[
        "kernel",
        "verdict",
        "tier",
        "generator",
        "family",
        "site_key",
        "latency_ms",
        "speedup",
        "roofline_fraction",
        "rationale",
        "snippet",
        "reason",
        "run_id",
        "gpu",
        "parent_id",
    ],  # fmt: skip
    column_config={
        "kernel": st.column_config.LinkColumn("kernel", display_text=r"id=(\d+)"),
        "site_key": "site",
        "latency_ms": st.column_config.NumberColumn("latency ms", format="%.4g"),
        "speedup": st.column_config.NumberColumn(format="%.3fx"),
        "roofline_fraction": st.column_config.NumberColumn("roofline", format="percent"),
        "run_id": "run",
        "parent_id": "parent",
    },
)
