"""Export: the winners as an installable package or KernelBench pairs, or every record."""

import streamlit as st

from app_pages import queries
from app_pages.common import open_store
from core.runtime.errors import KilnInputError
from store import EXPORT_FORMATS

DESCRIPTIONS = {
    "package": "an installable Python package of the kernels that beat PyTorch, with"
    " `install(model)` and a README of their speedups",
    "kernelbench": "each site's fastest accepted kernel with its problem, as KernelBench pairs"
    " (`python -m core.evaluate problem.py model_new.py` runs each)",
    "json": "every table as one JSON file, JSON columns parsed",
    "csv": "one CSV per table; candidates carry their site and verdict's headline numbers",
}

st.title("Export")
store = open_store()
runs = {run.id: run for run in queries.runs(store.path, store.version)}
run_id = st.selectbox(
    "Run",
    [None, *reversed(runs)],
    format_func=lambda i: (
        "every run (package, kernelbench: the latest)" if i is None
        else f"{i}: {runs[i].model_spec}"
    ),
)
fmt = st.radio(
    "Format", EXPORT_FORMATS, format_func=lambda f: f"{f}: {DESCRIPTIONS[f]}", horizontal=False
)
st.caption(
    f"The same as `python -m store --db {store.path} export --format {fmt}"
    + ("" if run_id is None else f" --run {run_id}")
    + " --out FOLDER`."
)


if st.button("Prepare the export", type="primary"):
    try:
        data = queries.export_zip(store.path, fmt, run_id)
    except KilnInputError as err:
        st.error(f"{err.problem}\n\nFix: {err.fix}")
        st.stop()
    scope = "all" if run_id is None else f"run{run_id}"
    st.download_button(
        f"Download kiln-{fmt}-{scope}.zip ({len(data) / 1024:.0f} KiB)",
        data,
        file_name=f"kiln-{fmt}-{scope}.zip",
        mime="application/zip",
    )
