"""`python -m core.optimize MODEL`: profile, search the hot sites, store every node, report."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from store import open_reader
from tests.test_list_sites_cli import ROOT, run_cli


def test_a_cpu_run_searches_refines_and_stores_every_parent_link(tmp_path):
    db = tmp_path / "kiln.db"
    result = run_cli("tests.models:make_mlp", "--device", "cpu", "--json", "--db", str(db),
                     "--max-candidates", "8", "--sites", "1", "--workers", "1",
                     "--trials", "2", "--warmup", "0", "--out", str(tmp_path / "out"))
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["run_id"] == 1 and report["device"] == "cpu"
    assert "searching Triton kernels only" in result.stderr  # no GPU: no CUDA tier
    for site in report["sites"]:
        best = site["best"]
        assert set(best) >= {"candidate_id", "tier", "latency_ms", "speedup"}
        assert best["tier"] in ("triton", "cuda", "torch")
    (searched,) = report["searched"]
    assert 1 <= searched["evaluations"] <= 8

    rows = sqlite3.connect(db).execute(
        "SELECT c.id, c.parent_id, c.site_id, v.accepted FROM candidates c "
        "LEFT JOIN verdicts v ON v.id = c.verdict_id").fetchall()
    assert len(rows) == searched["evaluations"]
    ids = {row[0]: row for row in rows}
    assert all(row[3] is not None for row in rows), "a candidate without its verdict"
    depth = {}
    for cid, parent, _, _ in sorted(rows):
        assert parent is None or parent in ids, "a parent link to nothing"
        depth[cid] = 1 if parent is None else depth[parent] + 1
    assert max(depth.values()) >= 2, "no refinement of a refinement"
    status, e2e = sqlite3.connect(db).execute("SELECT status, e2e FROM runs").fetchone()
    assert status == "done"
    assert json.loads(e2e) == report["e2e"]
    assert report["e2e"]["correct"], report["e2e"]["reason"]
    assert set(report["e2e"]) >= {"correct", "eager_ms", "optimized_ms", "compile_ms",
                                  "speedup_vs_eager", "speedup_vs_compile",
                                  "predicted_speedup"}
    assert searched["eager_ms"] > 0 and searched["compile_ms"] > 0
    assert report["e2e"]["floor_ms"] == pytest.approx(sum(s["floor_ms"] for s in report["sites"]))
    assert report["e2e"]["floor_ms"] > 0
    # Under the Triton interpreter no kernel beats PyTorch: none is installed, and the model,
    # its own baseline, is 1.00x however eager and torch.compile timed on this CPU.
    e2e = report["e2e"]
    assert e2e["installed"] == [] and e2e["speedup_vs_eager"] == e2e["speedup_vs_compile"] == 1.0
    report_md = Path(report["report_md"])
    assert report_md.parent.parent == tmp_path / "out"
    text = report_md.read_text()
    assert "## End to end" in text and "CPU timings, indicative only" in text
    assert "the model runs as it did: 1.00x" in text


def test_the_offline_generator_needs_no_openai_sdk():
    """A run with the rules generator imports nothing of the LLM client's."""
    check = ("import sys, core.optimize, core.optimize.run\n"
             "assert 'openai' not in sys.modules, 'the OpenAI SDK was imported'")
    result = subprocess.run([sys.executable, "-c", check], cwd=ROOT, capture_output=True,
                            text=True)
    assert result.returncode == 0, result.stderr


def test_each_run_of_a_model_writes_its_own_report(tmp_path):
    reports = []
    for _ in range(2):
        result = run_cli("tests.models:make_mlp", "--device", "cpu", "--json", "--db",
                         str(tmp_path / "kiln.db"), "--max-candidates", "2", "--sites", "1",
                         "--workers", "1", "--trials", "1", "--warmup", "0", "--no-e2e",
                         "--no-site-compile", "--out", str(tmp_path / "out"))
        assert result.returncode == 0, result.stderr
        report = json.loads(result.stdout)
        reports.append(Path(report["report_md"]))
        # --no-site-compile: the site's eager time is measured on its own, not taken from a
        # verdict's timing alone.
        site = report["searched"][0]
        assert site["eager_ms"] and site["compile_ms"] is None, site
        with open_reader(tmp_path / "kiln.db") as reader:
            stored = {s.key: s for s in reader.sites(report["run_id"])}
        assert stored[site["id"]].eager_ms is not None
    assert [r.name for r in reports] == ["report-run1.md", "report-run2.md"]
    assert [r.parent for r in reports] == [tmp_path / "out" / "tests.models-make_mlp"] * 2
    assert [r.read_text().splitlines()[2].split(" in ")[0] for r in reports] == ["Run 1", "Run 2"]
