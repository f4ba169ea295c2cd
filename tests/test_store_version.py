"""The store's version: equal while nothing changes, new after any write, a finished run or a
running run's writer dying; and whether a run is being written right now."""

from __future__ import annotations

import subprocess
import sys
import time

from store_fixture import REPO, fill_store, triton_candidate, verdict

from store import RunHeartbeat, Store, StoreVersion, open_reader


def version_of(path) -> StoreVersion:
    with open_reader(path) as store:
        return store.version()


def test_an_empty_store_has_no_runs(tmp_path):
    Store.open(tmp_path / "kiln.db").close()
    empty = version_of(tmp_path / "kiln.db")
    assert empty == StoreVersion((None,) * 5, None, ())
    assert not empty.has_runs and not empty.writing()


def test_every_kind_of_write_gives_a_new_version(tmp_path):
    filled = fill_store(tmp_path / "kiln.db")
    first = version_of(filled.path)
    assert first == version_of(filled.path), "nothing written, the same version"
    assert first.has_runs
    # The run's writer is this test process, which is alive.
    (beat,) = first.running
    assert (beat.run_id, beat.writer_alive) == (filled.run, True)
    assert first.writing() and first.writing(filled.run) and not first.writing(filled.run + 1)

    seen = [first]
    with Store.open(filled.path) as store:
        writes = [
            lambda: store.add_verdict(filled.pending, verdict(accepted=True, latency_ms=0.4)),
            lambda: store.add_candidate(
                filled.pointwise, parent_id=filled.pending, tier="triton", generator="rules",
                rationale="r", source=triton_candidate(64),
            ),
            lambda: store.add_llm_call(
                filled.run, site_id=None, model="m", prompt="p", reply="r", prompt_tokens=1,
                completion_tokens=1, latency_ms=1.0, cost_usd=0.0,
            ),
            lambda: store.heartbeat(filled.run),
            lambda: store.finish_run(filled.run, e2e={"eager_ms": 1.0}),
        ]  # fmt: skip
        for write in writes:
            # Heartbeats are stamped to the millisecond: let the clock move past the last one.
            time.sleep(0.002)
            write()
            seen.append(version_of(filled.path))
    assert len(set(seen)) == len(seen), "a write left the version as it was"
    assert seen[-1].running == () and seen[-1].last_finished_at is not None


def test_a_run_whose_writer_died_is_not_being_written(tmp_path):
    path = tmp_path / "kiln.db"
    started = subprocess.run(
        [sys.executable, "-c",
         "import sys; from store import Store\n"
         "store = Store.open(sys.argv[1])\n"
         "print(store.start_run(model_spec='m.py', model_hash='h', gpu='H200', versions={},"
         " config={}))",
         str(path)],
        cwd=REPO, capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip
    run = int(started.stdout)
    version = version_of(path)
    assert version.running == (RunHeartbeat(run, version.running[0].heartbeat_at, False),)
    assert not version.writing() and not version.writing(run)
