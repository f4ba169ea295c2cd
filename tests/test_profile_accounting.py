"""The site table adds up: sites plus kept ops come to the captured program, the marks' own
cost taken out of the gaps they close."""

from __future__ import annotations

import time

import pytest

from core.profile.in_situ import ProfileConfig, _by_owner, _gaps, mark_cost
from core.profile.pipeline import ListSitesConfig, list_sites
from core.runtime.capture import Mark, Recorder

EXAMPLE = "examples/mlp_block.py"


def profile(tmp_path) -> dict:
    return list_sites(ListSitesConfig(model=EXAMPLE, device="cpu", out=tmp_path,
                                      profile=ProfileConfig(3, 60), quiet=True))


def test_the_bundled_examples_parts_add_up_to_the_captured_program(tmp_path):
    report = profile(tmp_path)
    assert report["accounted_ms"] == pytest.approx(report["captured_ms"], rel=0.10)
    assert all(site["time_ms"] > 0 for site in report["sites"]), "a site owns no time"


def test_the_marks_own_cost_is_taken_out(tmp_path, monkeypatch):
    """Marks made a tenth of a millisecond dearer (more than the example's sites take) still
    leave the parts adding up: the cost is measured and taken out of every gap."""
    mark = Recorder.mark

    def dear_mark(self: Recorder, graph: int, boundary: int) -> None:
        mark(self, graph, boundary)
        if self.active:
            begin = time.perf_counter()
            while time.perf_counter() - begin < 1e-4:
                pass

    monkeypatch.setattr(Recorder, "mark", dear_mark)
    report = profile(tmp_path)
    assert report["mark_ms"] >= 0.08
    # A forward makes several marks: at least two marks' cost must show.
    assert report["instrumented_ms"] > report["captured_ms"] + 2 * report["mark_ms"], (
        "the marks cost nothing")
    assert report["accounted_ms"] == pytest.approx(report["captured_ms"], rel=0.10)


def test_each_gap_loses_one_marks_cost_and_goes_to_its_owner():
    def at(ms: float, graph: int, boundary: int) -> Mark:
        return Mark(graph, boundary, None, int(ms * 1e6))

    # Outside the graph, segment 0 (a site), segment 1 (no site), outside again.
    marks = [at(0.0, -1, 0), at(0.5, 0, 0), at(2.5, 0, 1), at(2.6, 0, 2), at(3.0, -1, 1)]
    gaps = _gaps(marks, lambda graph, boundary: "site" if boundary == 0 else None)
    assert [who for who, _ in gaps] == ["outside", "site", "kept", "outside"]
    parts = _by_owner(gaps, mark_ms=0.2)
    assert parts == pytest.approx({"outside": 0.3 + 0.2, "site": 1.8, "kept": 0.0})


def test_a_marks_cost_is_the_marked_forwards_excess_shared_by_its_gaps():
    forwards = [[("outside", 0.1), ("site", 0.5), ("kept", 0.2), ("outside", 0.2)]] * 3
    assert mark_cost(1.0, 0.6, forwards) == pytest.approx(0.1)
    # Noise that makes the marked forward the faster costs the marks nothing, not less.
    assert mark_cost(0.5, 0.6, forwards) == 0.0
    assert mark_cost(1.0, 0.6, []) == 0.0
