"""The tree search on a synthetic latency landscape whose optimum is known."""

from __future__ import annotations

import random

import pytest

from core.search.tree import SearchConfig, SiteSearch, going_on
from generators.base import Feedback, Parent, Proposal, Proposals

SIZE = 16
OPTIMUM = (11, 4)
BASELINE_MS = 4.0


def latency(a: int, b: int) -> float | None:
    """A bowl with its minimum (1.0 ms) at OPTIMUM; a corner of configs fails to compile."""
    if a + b > 26:
        return None
    return 1.0 + 0.05 * ((a - OPTIMUM[0]) ** 2 + (b - OPTIMUM[1]) ** 2)


def proposal(a: int, b: int, why: str) -> Proposal:
    return Proposal(f"# a={a} b={b}", "triton", "synthetic", why, {"a": a, "b": b})


class Landscape:
    """A generator (drafts, then one-step neighbours) and an evaluator over the bowl."""

    def __init__(self) -> None:
        self.seen: set[tuple[int, int]] = set()
        self.evaluated: list[tuple[int, int]] = []

    def propose(self, parent: Parent | None, n: int) -> Proposals:
        if parent is None:
            options = [(2, 2), (3, 13)]
        else:
            a, b = parent.proposal.settings["a"], parent.proposal.settings["b"]
            options = [(a + 1, b), (a - 1, b), (a, b + 1), (a, b - 1)]
        fresh = [o for o in options if o not in self.seen and all(0 <= v < SIZE for v in o)]
        chosen = fresh[:n]
        self.seen.update(chosen)
        if not chosen:
            return Proposals([], declined="no untried neighbours")
        return Proposals([proposal(a, b, f"step to {a},{b}") for a, b in chosen])

    def evaluate(self, proposals: list[Proposal]) -> list[Feedback]:
        results = []
        for p in proposals:
            key = (p.settings["a"], p.settings["b"])
            self.evaluated.append(key)
            ms = latency(*key)
            results.append(Feedback(correct=ms is not None, latency_ms=ms,
                                    baseline_ms=BASELINE_MS,
                                    reason="" if ms else "compile error"))
        return results


def run(seed: int, budget: int, floor_ms: float = 0.1, stall: int = 1000,
        strategy: str = "uct"):
    world = Landscape()
    bests: list[float] = []
    search = SiteSearch(BASELINE_MS, floor_ms, world.propose, world.evaluate,
                        record=lambda node: bests.append(search.best_ms),
                        config=SearchConfig(seed=seed, stall=stall, batch=2, strategy=strategy))
    while not search.done and search.evaluations < budget:
        if search.step(limit=budget - search.evaluations) == 0:
            break
    return search, world, bests


def evaluations_to_optimum(world: Landscape) -> int:
    return world.evaluated.index(OPTIMUM) + 1


def random_search_cost(seed: int) -> int:
    grid = [(a, b) for a in range(SIZE) for b in range(SIZE)]
    random.Random(seed).shuffle(grid)
    return grid.index(OPTIMUM) + 1


def test_finds_the_optimum_with_far_fewer_evaluations_than_random_or_exhaustive():
    costs = []
    for seed in range(5):
        search, world, _ = run(seed, budget=SIZE * SIZE)
        assert search.best.proposal.settings == {"a": OPTIMUM[0], "b": OPTIMUM[1]}
        costs.append(evaluations_to_optimum(world))
    tree = sum(costs) / len(costs)
    random_cost = sum(random_search_cost(seed) for seed in range(50)) / 50
    assert tree <= 0.5 * random_cost, (tree, random_cost)
    assert tree <= 0.25 * SIZE * SIZE, tree


def test_beats_random_expansion_of_the_same_tree():
    """The `random` strategy draws the node to expand uniformly: same generator, no UCT."""
    def mean_cost(strategy: str) -> float:
        costs = []
        for seed in range(8):
            search, world, _ = run(seed, budget=SIZE * SIZE, strategy=strategy)
            assert search.best.proposal.settings == {"a": OPTIMUM[0], "b": OPTIMUM[1]}
            costs.append(evaluations_to_optimum(world))
        return sum(costs) / len(costs)

    tree, randomly = mean_cost("uct"), mean_cost("random")
    assert tree <= 0.5 * randomly, (tree, randomly)


def test_never_loses_a_best_once_found():
    _, _, bests = run(seed=3, budget=80)
    assert all(later <= earlier for earlier, later in zip(bests, bests[1:], strict=False))


@pytest.mark.parametrize("budget", [1, 5, 17])
def test_respects_the_evaluation_budget(budget):
    search, world, _ = run(seed=0, budget=budget)
    assert search.evaluations == len(world.evaluated) <= budget


def test_stops_at_the_floor_and_when_stalled():
    at_floor, _, _ = run(seed=0, budget=500, floor_ms=1.2 * 0.9)
    assert at_floor.done and at_floor.best_ms <= 1.2
    stalled, world, _ = run(seed=0, budget=500, stall=5)
    assert stalled.done and stalled.since_best >= 5 and len(world.evaluated) < 500


def test_a_stalled_search_goes_on_when_allowed_more():
    search, world, _ = run(seed=0, budget=500, stall=5)
    assert search.stalled and not search.at_floor and not search.stuck
    stopped_at = len(world.evaluated)
    search.go_on()
    assert not search.done
    while not search.done and search.step(limit=500 - search.evaluations):
        pass
    assert len(world.evaluated) > stopped_at
    assert search.done and (search.at_floor or search.stuck or search.since_best >= 10)


def test_only_searches_stopped_for_want_of_a_new_best_go_on():
    at_floor, _, _ = run(seed=0, budget=500, floor_ms=1.2 * 0.9)
    stalled, _, _ = run(seed=0, budget=500, stall=5)
    assert going_on([at_floor, stalled]) == [stalled]
    assert at_floor.done and not stalled.done


def test_same_seed_same_tree():
    first = [n for n in run(seed=7, budget=40)[1].evaluated]
    second = [n for n in run(seed=7, budget=40)[1].evaluated]
    assert first == second


def test_rejected_kernels_score_zero_and_get_no_children():
    search, world, _ = run(seed=1, budget=120)
    stack = [search.root]
    while stack:
        node = stack.pop()
        if node.feedback is not None and not node.feedback.correct:
            assert node.children == []
        stack.extend(node.children)
