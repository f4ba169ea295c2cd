"""App benchmark on the CPU: fill a store with 100,000 candidates, then time each page's render.

    python -m bench.app_bench [--candidates 100000] [--db PATH] [--repeats 5]

Target: every page renders in under 1 s. Each render is a fresh `AppTest` run, whose query
cache starts empty, so the times are those of a first visit (no cached query results).
"""

from __future__ import annotations

import argparse
import os
import platform
import random
import sqlite3
import tempfile
from pathlib import Path

from streamlit.testing.v1 import AppTest

from bench.store_bench import fill, row, timed
from store import Store, open_reader

APP = Path(__file__).resolve().parents[1] / "app.py"
TARGET_MS = 1000.0


def pages(path: Path) -> dict[str, tuple[str, dict[str, str]]]:
    """Each page with the query parameters a user would arrive with, on the busiest data."""
    with open_reader(path) as reader:
        run = reader.latest_run_id() - 1
        site = reader.sites(run)[0]
        deepest = reader.candidates(site_id=site.id)[-1]
    return {
        "Overview": ("overview.py", {}),
        "Run": ("run.py", {"run": str(run)}),
        "Search tree (site of 500 candidates)": (
            "search_tree.py", {"run": str(run), "site": str(site.id)}
        ),
        "Kernels (newest, no words)": ("kernels.py", {}),
        "Kernels (search matching every candidate)": ("kernels.py", {"q": "tl.load"}),
        "Kernels (search, 1 in 6 match)": ("kernels.py", {"q": "online softmax"}),
        "Kernel (end of a 500-long lineage)": ("kernel.py", {"id": str(deepest.id)}),
        "Compare": ("compare.py", {"a": str(deepest.id - 1), "b": str(deepest.id)}),
        "Export": ("export.py", {}),
    }  # fmt: skip


def render(page: str, query: dict[str, str]) -> None:
    app = AppTest.from_file(APP, default_timeout=60)
    app.run()
    app.switch_page(f"app_pages/{page}")
    app.query_params.update(query)
    app.run()
    if app.exception:
        raise RuntimeError(f"{page} raised: {[e.message for e in app.exception]}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--candidates", type=int, default=100_000)
    parser.add_argument("--db", type=Path, help="store to fill (default: a temporary file)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    folder = tempfile.TemporaryDirectory()
    path = args.db or Path(folder.name) / "bench.db"
    if not path.exists():
        with Store.open(path) as store:
            _, fill_s = fill(store, args.candidates, random.Random(args.seed))
        print(f"filled {args.candidates} candidates in {fill_s:.1f} s")
    os.environ["KILN_DB"] = str(path)
    print(
        f"{path.stat().st_size / 2**20:.0f} MiB store, Python {platform.python_version()},"
        f" SQLite {sqlite3.sqlite_version}"
    )
    render("overview.py", {})  # imports and the first script run, not counted
    print("\n| page | median ms | p95 ms | max ms | target ms | p95 meets it | note |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for name, (page, query) in pages(path).items():
        samples = timed(lambda p=page, q=query: render(p, q), args.repeats)
        print(row(name, samples, TARGET_MS, "fresh AppTest: app.py run, then the page"))
    folder.cleanup()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
