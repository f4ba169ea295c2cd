"""Which tier a site's search starts in: Triton where the run has it, else the tier it was
given (`--tiers cuda` proposes CUDA kernels from the first); and the CUDA tier joining a site
after its first round."""

from __future__ import annotations

from pathlib import Path

import pytest

from core.optimize.config import OptimizeConfig
from core.optimize.run import OptimizeRun
from core.profile.in_situ import ProfileConfig
from core.profile.pipeline import ListSitesConfig
from core.profile.progress import Progress
from generators.base import Parent, Proposals
from generators.rules import RulesGenerator


@pytest.mark.parametrize(("tiers", "first"), [
    (("triton", "cuda"), ("triton",)),
    (("cuda",), ("cuda",)),
    (("triton",), ("triton",)),
])
def test_a_sites_search_starts_in_the_runs_first_tier(tmp_path, monkeypatch, tiers, first):
    asked: list[tuple[str, ...]] = []

    def propose(self, problem: Path, parent: Parent | None, n: int,
                tiers: tuple[str, ...] = ("triton",)) -> Proposals:
        asked.append(tuple(tiers))
        return Proposals([], declined="no kernel: the test only records the tiers asked")

    monkeypatch.setattr(RulesGenerator, "propose", propose)
    profile = ListSitesConfig(model="tests.models:make_mlp", device="cpu",
                              out=tmp_path / "out", profile=ProfileConfig(0, 2), quiet=True)
    config = OptimizeConfig(profile=profile, db=tmp_path / "kiln.db", max_candidates=4,
                            sites=1, tiers=tiers, site_compile=False, e2e=False)
    report = OptimizeRun(config, Progress(enabled=False)).execute()
    assert report["status"] == "done"
    assert asked and asked[0] == first, asked


def test_the_cuda_tier_joins_a_site_after_its_first_round(tmp_path, monkeypatch):
    """Not once Triton settles: a large site judges a few kernels a minute. Only Triton kernels
    are judged here (no GPU): the tiers asked for are what is checked."""
    asked: list[tuple[str, ...]] = []
    real_propose = RulesGenerator.propose

    def propose(self, problem: Path, parent: Parent | None, n: int,
                tiers: tuple[str, ...] = ("triton",)) -> Proposals:
        asked.append(tuple(tiers))
        return real_propose(self, problem, parent, n, ("triton",))

    monkeypatch.setattr(RulesGenerator, "propose", propose)
    profile = ListSitesConfig(model="tests.models:make_mlp", device="cpu",
                              out=tmp_path / "out", profile=ProfileConfig(0, 2), quiet=True)
    config = OptimizeConfig(profile=profile, db=tmp_path / "kiln.db", max_candidates=6,
                            sites=1, tiers=("triton", "cuda"), cuda_share=0.0,
                            site_compile=False, e2e=False, workers=1)
    report = OptimizeRun(config, Progress(enabled=False)).execute()
    assert report["status"] == "done"
    first_round = asked.index(("triton", "cuda"))
    assert first_round > 0 and set(asked[:first_round]) == {("triton",)}, asked
