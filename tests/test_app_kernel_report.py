"""The Kernel page's "Why it is slow": the diagnosis line, the compiler's figures per kernel and
where they were read, or the note saying why there are none."""

from __future__ import annotations

from pathlib import Path

import pytest

from core.diagnosis import SPILLING, diagnose
from core.kernel_report import INTERPRETER_NOTE, cuda_source_report
from core.verdict import Reason, Verdict
from store import Store, open_reader
from tests.app_fixture import AppStore, app_store, open_page, texts

__all__ = ["app_store"]

PRESSURE = Path(__file__).parent / "data" / "kernel_report" / "pressure.cu"


def test_a_cuda_kernel_shows_its_figures_and_diagnosis(tmp_path, monkeypatch):
    # The figures are nvcc's for a kernel that spills; without a GPU it was never timed.
    report = cuda_source_report(PRESSURE.read_text())
    diagnosis = str(diagnose(report, None, None))
    path = tmp_path / "kiln.db"
    with Store.open(path, create=True) as store:
        run = store.start_run(model_spec="examples/pressure.py", model_hash="0", gpu="cpu",
                              versions={}, config={})
        site = store.add_site(run_id=run, key="pointwise-0", family="pointwise",
                              signature="x", ops=["mul"], calls=1, share=1.0, time_ms=1.0,
                              eager_ms=None, compile_ms=None, floor_ms=0.1,
                              problem_source="class Model: pass\n")
        candidate = store.add_candidate(site_id=site, parent_id=None, tier="cuda",
                                        generator="rules", rationale="a spilling kernel",
                                        source=PRESSURE.read_text())
        store.add_verdict(candidate.id, Verdict.rejected(
            Reason.NEEDS_GPU, "running it needs a GPU", compiled=True, tier="cuda",
            kernel_report=report.to_dict(), diagnosis=diagnosis))
    monkeypatch.setenv("KILN_DB", str(path))
    app = open_page("kernel.py", id=candidate.id)
    assert diagnosis.startswith(SPILLING)
    assert f"**Diagnosis:** {diagnosis}" in texts(app)
    (table,) = [t.value for t in app.table if "registers" in t.value.columns]
    (kernel,) = report.kernels
    row = table.iloc[0]
    assert row["kernel"] == "pressure" and row["registers"] == kernel.registers
    assert row["spill stores B"] == kernel.spill_store_bytes > 0
    assert row["16-byte loads"] == 0 and row["matrix ops"] == "none"
    assert "registers: ptxas -v" in texts(app) and "loads: cuobjdump -sass" in texts(app)


@pytest.fixture
def store_env(app_store: AppStore, monkeypatch: pytest.MonkeyPatch) -> AppStore:
    monkeypatch.setenv("KILN_DB", str(app_store.path))
    return app_store


def test_a_kernel_judged_by_the_interpreter_says_why_it_has_no_figures(store_env):
    with open_reader(store_env.path) as reader:
        accepted = [c for c in store_env.candidates
                    if (k := reader.candidate(c)).summary.accepted and k.summary.tier == "triton"]
    app = open_page("kernel.py", id=accepted[0])
    page = texts(app)
    assert "**Diagnosis:** none: nothing the rules could tell" in page
    assert INTERPRETER_NOTE in page
