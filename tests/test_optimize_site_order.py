"""Which site the search steps next: every site gets a first step before any gets a second, then
the site with the largest expected gain (its share of the model, its room above its floor, fewer
kernels tried) goes first."""

from __future__ import annotations

import dataclasses
import math

import pytest

from core.optimize.site_run import SiteRun, site_priority
from core.profile.pipeline import ListSitesConfig, profile_sites
from core.search.tree import SiteSearch
from generators.base import Feedback, Proposal


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    profiled = profile_sites(ListSitesConfig(model="examples/mlp_block.py", device="cpu",
                                             out=tmp_path_factory.mktemp("out"), quiet=True))
    return profiled.table.sites[0]


def site_run(site, time_ms: float, kernels: int = 0, steps: int = 0) -> SiteRun:
    search = SiteSearch(math.inf, 0.0, propose=None, evaluate=None, record=None)
    run = SiteRun(dataclasses.replace(site, time_ms=time_ms), 1, search, ("triton",), steps=steps)
    run.note_baseline(time_ms)
    for index in range(kernels):
        run.search.adopt(run.search.root, Proposal(f"{index}", "triton", "rules", ""),
                         Feedback(correct=True, latency_ms=time_ms), candidate_id=index + 1)
    return run


def test_a_site_never_stepped_goes_before_a_larger_one_already_stepped(site):
    large = site_run(site, time_ms=9.0, kernels=2, steps=1)
    small = site_run(site, time_ms=1.0)
    assert site_priority(large, 10.0)[1] > site_priority(small, 10.0)[1]  # larger gain...
    assert max([large, small], key=lambda r: site_priority(r, 10.0)) is small  # ...yet second


def test_once_every_site_was_stepped_the_larger_gain_goes_first(site):
    large = site_run(site, time_ms=9.0, kernels=2, steps=1)
    small = site_run(site, time_ms=1.0, kernels=2, steps=1)
    assert max([small, large], key=lambda r: site_priority(r, 10.0)) is large


def test_kernels_tried_lower_a_sites_turn(site):
    tried = site_run(site, time_ms=5.0, kernels=15, steps=3)
    fresh = site_run(site, time_ms=4.0, kernels=1, steps=1)
    assert max([tried, fresh], key=lambda r: site_priority(r, 10.0)) is fresh
