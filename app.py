"""Kiln's app: browse, search, compare and export every kernel Kiln tried.

    streamlit run app.py -- --db kiln.db

The store comes from `--db` (after `--`), else `$KILN_DB`, else ./kiln.db, and is opened
read-only, so the app can run beside an optimizer writing to the same store.
"""

import streamlit as st

PAGES = [
    st.Page("app_pages/overview.py", title="Overview", icon=":material/home:", default=True),
    st.Page("app_pages/run.py", title="Run", icon=":material/speed:", url_path="run"),
    st.Page(
        "app_pages/search_tree.py",
        title="Search tree",
        icon=":material/account_tree:",
        url_path="tree",
    ),
    st.Page("app_pages/kernels.py", title="Kernels", icon=":material/search:", url_path="kernels"),
    st.Page("app_pages/kernel.py", title="Kernel", icon=":material/code:", url_path="kernel"),
    st.Page("app_pages/compare.py", title="Compare", icon=":material/compare:", url_path="compare"),
    st.Page("app_pages/export.py", title="Export", icon=":material/download:", url_path="export"),
]

st.set_page_config(page_title="Kiln", page_icon=":material/local_fire_department:", layout="wide")
st.navigation(PAGES).run()
