"""A site's baseline is revised with every eager time its verdicts bring: one slow
measurement (a cold worker's first) cannot set it, nor the speedups measured against it."""

from __future__ import annotations

import math

import pytest

from core.optimize.site_run import SiteRun
from core.profile.pipeline import ListSitesConfig, profile_sites
from core.profile.sites import Site
from core.search.tree import SiteSearch
from generators.base import Feedback, Proposal

OUTLIER_MS, SITE_MS = 19.96, 0.076  # a first verdict's baseline against the profile's


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Site:
    profiled = profile_sites(ListSitesConfig(model="examples/mlp_block.py", device="cpu",
                                             out=tmp_path_factory.mktemp("out"), quiet=True))
    return profiled.table.sites[0]


def site_run(site: Site) -> SiteRun:
    search = SiteSearch(math.inf, site.cost.floor_ms, propose=None, evaluate=None, record=None)
    return SiteRun(site, 1, search, ("triton",))


def kernel(run: SiteRun, latency_ms: float) -> None:
    run.search.adopt(run.search.root, Proposal(f"{latency_ms}", "triton", "rules", ""),
                     Feedback(correct=True, latency_ms=latency_ms), candidate_id=1)


def test_one_slow_first_measurement_cannot_set_the_baseline(site):
    run = site_run(site)
    run.note_baseline(OUTLIER_MS)
    kernel(run, 0.05)
    assert run.search.baseline_ms == OUTLIER_MS  # all there is, so far
    for eager_ms in (SITE_MS, 0.078, 0.075):
        run.note_baseline(eager_ms)
    assert run.eager_ms == SITE_MS and run.search.baseline_ms == SITE_MS
    assert run.winner.speedup_vs_eager == pytest.approx(SITE_MS / 0.05)
    # The kernel's reward is measured against the revised baseline: 1.52x, not 399x.
    assert run.search.root.value == pytest.approx(0.5 + math.log2(SITE_MS / 0.05) / 4)


def test_the_sites_own_timing_outvotes_a_slow_verdict(site):
    run = site_run(site)
    run.note_baseline(SITE_MS, compile_ms=0.09)
    run.note_baseline(OUTLIER_MS)
    assert run.eager_ms == SITE_MS and run.search.baseline_ms == SITE_MS
    run.note_baseline(None, compile_ms=0.06)
    assert run.search.baseline_ms == 0.06


def test_a_site_pytorch_already_runs_at_its_floor_says_so_and_is_not_searched(site):
    run = site_run(site)
    floor = site.cost.floor_ms
    run.note_baseline(floor * 3, compile_ms=floor * 1.05)  # compile at 95 % of the floor
    assert run.search.done
    assert run.at_floor_note() == (
        f"{site.key}: PyTorch already runs at 95% of the GPU's byte floor "
        f"({floor * 1.05:.4f} ms against {floor:.4f}): left to PyTorch, no kernel could gain "
        "much")


def test_a_site_above_its_floor_has_no_such_note(site):
    run = site_run(site)
    run.note_baseline(site.cost.floor_ms * 1.5)
    assert not run.search.done and run.at_floor_note() is None
    kernel(run, site.cost.floor_ms * 1.01)  # a kernel at the floor: searched, not skipped
    assert run.search.done and run.at_floor_note() is None
