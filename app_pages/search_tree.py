"""Search tree: a site's candidates in the order tried, and the tree their parent links make."""

import pandas as pd
import streamlit as st

from app_pages import queries
from app_pages.charts import progress_chart, tree_chart, tree_layout
from app_pages.common import PAGE_KERNEL, live, ms, open_store, query_int
from store.labels import ACCEPTED

opened = open_store()
runs = {run.id: run for run in queries.runs(opened.path, opened.version)}
run_ids = list(reversed(runs))
chosen_run = query_int("run")
left, right = st.columns(2)
run_id = left.selectbox(
    "Run",
    run_ids,
    index=run_ids.index(chosen_run) if chosen_run in runs else 0,
    format_func=lambda ident: f"{ident}: {runs[ident].model_spec}",
)
sites = queries.sites(opened.path, opened.version, run_id)
if not sites:
    st.info(f"Run {run_id} has no sites yet.")
    st.stop()
by_id = {site.id: site for site in sites}
chosen_site = query_int("site")
site_id = right.selectbox(
    "Site (by share of model time)",
    list(by_id),
    index=list(by_id).index(chosen_site) if chosen_site in by_id else 0,
    format_func=lambda ident: f"{by_id[ident].key} ({by_id[ident].share * 100:.1f}%)",
)
st.query_params.update({"run": str(run_id), "site": str(site_id)})


def tried_in_order(candidates: pd.DataFrame) -> pd.DataFrame:
    """The candidates with their place in the search and the best accepted latency so far."""
    accepted = candidates["latency_ms"].where(candidates["verdict"] == ACCEPTED)
    best_so_far = accepted.cummin().ffill()  # any other kernel keeps the best before it
    return candidates.assign(order=range(1, len(candidates) + 1), best_so_far=best_so_far)


def render() -> None:
    store = open_store()
    site = by_id[site_id]
    st.title(f"Search tree of {site.key}")
    st.caption(f"{site.signature} · baseline {ms(site.baseline_ms)} · floor {ms(site.floor_ms)}")
    candidates = queries.site_candidates(store.path, store.version, site_id)
    if candidates.empty:
        st.info("No candidates for this site yet.")
        return
    tried = tried_in_order(candidates)
    best = tried["best_so_far"].dropna()
    st.caption(
        f"{len(tried)} candidates, {int((tried['verdict'] == ACCEPTED).sum())} accepted;"
        f" best {ms(best.iloc[-1] if not best.empty else None)}."
        " Click a point to open its kernel."
    )
    st.altair_chart(progress_chart(tried), width="stretch")
    nodes, edges = tree_layout(tried)
    st.altair_chart(tree_chart(nodes, edges), width="stretch")
    labels = dict(zip(tried["id"], tried["verdict"], strict=True))
    ident = st.selectbox(
        "Open a kernel", list(labels)[::-1], format_func=lambda i: f"{i}: {labels[i]}"
    )
    st.page_link(PAGE_KERNEL, label=f"Kernel {ident}", query_params={"id": str(ident)})


live(render, opened.version.writing(run_id))
