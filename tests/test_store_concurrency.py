"""One writer process and reader processes at once: no reader ever sees half a candidate."""

from __future__ import annotations

import json
import subprocess
import sys

from store_fixture import REPO, assert_search_index_matches_records

from store import open_reader

CANDIDATES = 300

WRITER = """
import sys, time
from store import Store
from store_fixture import triton_candidate, verdict

with Store.open(sys.argv[1]) as store:
    run = store.start_run(model_spec="m.py", model_hash="h", gpu="H200", versions={}, config={})
    site = store.add_site(
        run, key="pointwise-00000000", family="pointwise", signature="relu(f32[8])",
        ops=["aten.relu.default"], calls=1, share=1.0, time_ms=1.0, eager_ms=1.0,
        compile_ms=1.0, floor_ms=0.1, problem_source="problem",
    )
    print(run, flush=True)
    sys.stdin.readline()  # the readers are up
    parent = None
    for i in range(int(sys.argv[2])):
        with store.batch():
            source = triton_candidate(64) + f"# marker{i}\\n"
            new = store.add_candidate(site, parent_id=parent, tier="triton", generator="rules",
                                      rationale=f"variant {i}", source=source)
            store.add_verdict(new.id, verdict(accepted=i % 3 == 0, latency_ms=1.0 / (i + 1)))
        parent = new.id
        time.sleep(0.002)
    store.finish_run(run, e2e={"speedup_vs_eager": 1.2})
"""

READER = """
import json, sys
from store import open_reader, source_hash

errors, counts, iterations = [], set(), 0
with open_reader(sys.argv[1]) as store:
    print("up", flush=True)
    done = False
    while not done:
        done = store.run(int(sys.argv[2])).status == "done"
        listed = store.candidates()
        counts.add(len(listed))
        iterations += 1
        unjudged = [c.id for c in listed if c.accepted is None]
        if unjudged:
            errors.append(f"candidates without their verdict: {unjudged}")
        if listed:
            newest = store.candidate(listed[-1].id)
            if newest.source_hash != source_hash(newest.source):
                errors.append(f"candidate {newest.id}: source and hash disagree")
            marker = newest.source.rsplit("marker", 1)[1].strip()
            hits = [h.id for h in store.search(f"marker{marker}")]
            if hits != [newest.id]:
                errors.append(f"candidate {newest.id} not in the index: search gave {hits}")
print(json.dumps({"errors": errors[:5], "counts": sorted(counts), "iterations": iterations}))
"""


def python(script: str, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", script, *args],
        cwd=REPO,
        env={"PYTHONPATH": f"{REPO}:{REPO / 'tests'}", "PATH": "/usr/bin:/bin"},
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_readers_see_whole_candidates_while_the_writer_writes(tmp_path):
    path = tmp_path / "kiln.db"
    writer = python(WRITER, str(path), str(CANDIDATES))
    run_id = writer.stdout.readline().strip()
    assert run_id, writer.stderr.read()
    readers = [python(READER, str(path), run_id) for _ in range(2)]
    for reader in readers:
        assert reader.stdout.readline().strip() == "up", reader.stderr.read()
    writer.stdin.write("go\n")
    writer.stdin.flush()

    _, writer_err = writer.communicate(timeout=120)
    assert writer.returncode == 0, f"the writer failed:\n{writer_err}"
    for reader in readers:
        out, err = reader.communicate(timeout=120)
        assert reader.returncode == 0, f"a reader failed:\n{err}"
        report = json.loads(out)
        assert report["errors"] == [], report["errors"]
        # The reader must have watched the store grow, or this proves nothing about concurrency.
        assert len(report["counts"]) >= 5, f"reader saw only counts {report['counts']}"
        assert report["counts"][-1] == CANDIDATES

    with open_reader(path) as store:
        assert store.run(int(run_id)).candidates == CANDIDATES
    assert_search_index_matches_records(path)
