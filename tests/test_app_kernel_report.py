"""The Kernel page's "Why it is slow": the diagnosis line, the compiler's figures per kernel and
where they were read, or the note saying why there are none."""

from __future__ import annotations

from pathlib import Path

import pytest

from core.evaluate.counters import CounterReport, parse_ncu_csv
from core.evaluate.diagnosis import SPILLING, diagnose
from core.evaluate.kernel_report import INTERPRETER_NOTE, cuda_source_report
from core.evaluate.verdict import Reason, Verdict
from store import Store, open_reader
from tests.app_fixture import AppStore, app_store, open_page, texts

__all__ = ["app_store"]

PRESSURE = Path(__file__).parent / "data" / "kernel_report" / "pressure.cu"
POINTWISE_NCU = Path(__file__).parent / "data" / "ncu" / "pointwise.csv"


def store_one(path: Path, verdict: Verdict, source: str = "class ModelNew: pass\n") -> int:
    with Store.open(path, create=True) as store:
        run = store.start_run(model_spec="examples/k.py", model_hash="0", gpu="NVIDIA H200",
                              versions={}, config={})
        site = store.add_site(run_id=run, key="pointwise-0", family="pointwise",
                              signature="x", ops=["mul"], calls=1, share=1.0, time_ms=1.0,
                              eager_ms=None, compile_ms=None, floor_ms=0.1,
                              problem_source="class Model: pass\n")
        candidate = store.add_candidate(site_id=site, parent_id=None, tier="triton",
                                        generator="rules", rationale="a kernel", source=source)
        store.add_verdict(candidate.id, verdict)
    return candidate.id


def test_a_cuda_kernel_shows_its_figures_and_diagnosis(tmp_path, monkeypatch):
    # The figures are nvcc's for a kernel that spills; without a GPU it was never timed.
    report = cuda_source_report(PRESSURE.read_text())
    diagnosis = str(diagnose(report, None, None))
    path = tmp_path / "kiln.db"
    candidate = store_one(path, Verdict.rejected(
        Reason.NEEDS_GPU, "running it needs a GPU", compiled=True, tier="cuda",
        kernel_report=report.to_dict(), diagnosis=diagnosis), PRESSURE.read_text())
    monkeypatch.setenv("KILN_DB", str(path))
    app = open_page("kernel.py", id=candidate)
    assert diagnosis.startswith(SPILLING)
    assert f"Diagnosis: {diagnosis}" in texts(app)
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
        correct = [c for c in store_env.candidates
                   if (k := reader.candidate(c)).summary.correct and k.summary.tier == "triton"]
    app = open_page("kernel.py", id=correct[0])
    page = texts(app)
    assert "Diagnosis: none: nothing the rules could tell" in page
    assert INTERPRETER_NOTE in page


def test_hardware_counters_show_as_a_table_and_the_stalls_as_a_chart(tmp_path, monkeypatch):
    counters = CounterReport(parse_ncu_csv(POINTWISE_NCU.read_text()), seconds=9.1)
    diagnosis = str(diagnose(None, 0.1035, 0.0624, counters=counters))
    path = tmp_path / "kiln.db"
    candidate = store_one(path, Verdict(compiled=True, correct=True, accepted=True,
                                        latency_ms=0.1035, counters=counters.to_dict(),
                                        diagnosis=diagnosis))
    monkeypatch.setenv("KILN_DB", str(path))
    app = open_page("kernel.py", id=candidate)
    page = texts(app)
    assert f"Diagnosis: {diagnosis}" in page and "DRAM 50%" in diagnosis
    (table,) = [t.value for t in app.table if "DRAM % peak" in t.value.columns]
    row = table.iloc[0]
    assert row["kernel"] == "pointwise_kernel" and row["DRAM % peak"] == 49.66
    assert row["µs"] == 103.904 and row["top stalls"].startswith("long_scoreboard 36%")
    assert "What the warps of pointwise_kernel wait on, as a share of all stalls" in page
    assert "Collected in 9.1 s" in page
    assert app.get("arrow_vega_lite_chart") or app.get("vega_lite_chart"), "no stall chart"


def test_counters_that_could_not_be_read_say_why(tmp_path, monkeypatch):
    note = "ncu cannot read the hardware counters on this machine:\nERR_NVGPUCTRPERM"
    path = tmp_path / "kiln.db"
    candidate = store_one(path, Verdict(compiled=True, correct=True, accepted=True,
                                        latency_ms=0.2, counters=CounterReport(
                                            notes=[note]).to_dict()))
    monkeypatch.setenv("KILN_DB", str(path))
    page = texts(open_page("kernel.py", id=candidate))
    assert note in page and "Collected in" not in page
