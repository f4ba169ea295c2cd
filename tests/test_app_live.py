"""A run in progress: the app reads the store while another process writes it."""

import subprocess
import sys
import time

import pytest

from store import open_reader
from tests.app_fixture import (
    REPO,
    AppStore,
    app_store,
    chart_data,
    charts,
    open_page,
    wait_for_file,
)

__all__ = ["app_store"]


@pytest.fixture
def writer(app_store: AppStore, tmp_path, monkeypatch: pytest.MonkeyPatch):
    """A separate process replaying the filled run into a new store, one candidate per step."""
    target, signals = tmp_path / "live.db", tmp_path / "signals"
    signals.mkdir()
    code = (
        "import sys; from pathlib import Path; from tests.app_fixture import replay_run;"
        " replay_run(*map(Path, sys.argv[1:]))"
    )
    process = subprocess.Popen(
        [sys.executable, "-c", code, str(app_store.path), str(target), str(signals)], cwd=REPO
    )
    monkeypatch.setenv("KILN_DB", str(target))
    try:
        yield signals
        assert process.wait(timeout=60) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def overview_row(app) -> dict:
    (row,) = app.dataframe[0].value.to_dict("records")
    return row


def test_pages_show_new_candidates_of_a_running_run(app_store: AppStore, writer):
    with open_reader(app_store.path) as reader:
        hottest = reader.sites(app_store.run)[0].id
        # Which of the replayed candidates belong to the site the Search tree opens on.
        on_hottest = [c.site_id == hottest for c in reader.candidates(app_store.run)]
    wait_for_file(writer / "written-1")
    overview = open_page("overview.py")
    assert overview_row(overview)["status"] == "running"
    assert overview_row(overview)["candidates"] == 1
    assert any("refreshes on its own" in info.value for info in overview.info)
    tree = open_page("search_tree.py", run=1)
    assert len(chart_data(charts(tree)[0])) == sum(on_hottest[:1])

    for written in range(2, 5):
        (writer / f"go-{written - 1}").touch()
        wait_for_file(writer / f"written-{written}")
        overview.run()
        assert overview_row(overview)["candidates"] == written
        tree.run()
        assert len(chart_data(charts(tree)[0])) == sum(on_hottest[:written])

    for step in range(5, len(app_store.candidates) + 1):
        (writer / f"go-{step - 1}").touch()
        wait_for_file(writer / f"written-{step}")
    (writer / f"go-{len(app_store.candidates)}").touch()
    (writer / "finish").touch()
    wait_for_file(writer / f"written-{len(app_store.candidates)}")


def test_the_run_shows_done_once_finished(app_store: AppStore, writer):
    for step in range(1, len(app_store.candidates) + 1):
        wait_for_file(writer / f"written-{step}")
        (writer / f"go-{step}").touch()
    (writer / "finish").touch()
    overview = open_page("overview.py")
    deadline = time.monotonic() + 60
    while overview_row(overview)["status"] == "running" and time.monotonic() < deadline:
        overview.run()
    row = overview_row(overview)
    assert (row["status"], row["candidates"]) == ("done", len(app_store.candidates))
    assert not overview.info
