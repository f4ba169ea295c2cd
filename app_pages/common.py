"""What every page shares: the store's path, its read-only connection, its version, formatting.

The store is read through one read-only connection per path, shared by every session (SQLite
reads from several threads are safe on it). Query results are cached under the store's
*version* (`StoreReader.version`): the highest ids and the latest heartbeat, so a write by a
running optimizer gives a new version and the pages show the new rows on their next refresh.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import streamlit as st

from core.runtime.errors import KilnInputError
from store import CPU_TIMINGS, StoreReader, StoreVersion, open_reader

DEFAULT_DB = Path("kiln.db")
# A running search stores a candidate every few seconds at most (an evaluation compiles, checks
# and times it); refreshing every 5 s shows each one soon after it lands, and a refresh that
# finds the same version costs one small query.
LIVE_REFRESH_S = 5.0
START_HINT = """No runs in this store yet. Start one, and it appears here while it goes on:

```
python -m core.optimize examples/mlp_block.py --db {path}
```

then open this app on the same store: `streamlit run app.py -- --db {path}`
(or set `KILN_DB`)."""

PAGE_KERNEL = "app_pages/kernel.py"
PAGE_RUN = "app_pages/run.py"
PAGE_TREE = "app_pages/search_tree.py"


def db_path(argv: list[str] | None = None) -> Path:
    """The store: `--db PATH` after `--` on the command line, else `$KILN_DB`, else ./kiln.db."""
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--db", type=Path)
    known, _ = parser.parse_known_args(sys.argv[1:] if argv is None else argv)
    if known.db is not None:
        return known.db
    return Path(os.environ["KILN_DB"]) if os.environ.get("KILN_DB") else DEFAULT_DB


@st.cache_resource(show_spinner=False)
def reader_for(path: str) -> StoreReader:
    return open_reader(path)


@dataclass(frozen=True)
class Store:
    """The open store of this session and its version, the key of every cached query."""

    path: str
    version: StoreVersion

    @property
    def reader(self) -> StoreReader:
        return reader_for(self.path)


def open_store() -> Store:
    """The store this app was started on, or a page explaining how to get one (and a stop)."""
    path = db_path().resolve()
    if not path.exists():
        st.info(f"There is no Kiln store at `{path}` yet.\n\n" + START_HINT.format(path=path))
        st.stop()
    try:
        reader = reader_for(str(path))
    except KilnInputError as err:
        st.error(f"{err.problem}\n\nFix: {err.fix}")
        st.stop()
    version = reader.version()
    if not version.has_runs:
        st.info(START_HINT.format(path=path))
        st.stop()
    return Store(str(path), version)


def live(render: Callable[[], None], running: bool) -> None:
    """Render now, and again every few seconds while a run is being written."""
    st.fragment(render, run_every=LIVE_REFRESH_S if running else None)()


def query_int(name: str) -> int | None:
    value = st.query_params.get(name)
    return int(value) if value is not None and value.isdigit() else None


def kernel_url(candidate_id: int) -> str:
    return f"kernel?id={candidate_id}"


def timed_on(label: str, cpu_timings: bool) -> str:
    """A speedup's label, saying so when the run's timings are the CPU's."""
    return f"{label} ({CPU_TIMINGS})" if cpu_timings else label


def seconds(value: float | None) -> str:
    return "–" if value is None else f"{value:.3g} s"


def mebibytes(value: int | None) -> str:
    return "–" if value is None else f"{value / 2**20:,.1f} MiB"


def ms(value: float | None) -> str:
    return "–" if value is None else f"{value:.4g} ms"


def times(value: float | None) -> str:
    return "–" if value is None else f"{value:.3g}x"


def percent(value: float | None) -> str:
    return "–" if value is None else f"{value * 100:.1f}%"
