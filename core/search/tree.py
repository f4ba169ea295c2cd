"""Tree search over candidate kernels for one site: UCT with progressive widening.

The root is the PyTorch reference at the site's baseline latency (revised, and every reward
with it, as more measurements of the reference come in: `rebase`). Expanding a node asks the
generator for children of that node's kernel (for the root: drafts); every child is
evaluated, and its reward (speedup against the baseline on a log scale, zero if it failed a
check) is backed up to the root as a maximum: a subtree is worth its best kernel, since one
great kernel is all a site needs. A node may hold about `widening * visits ** 0.5` children, so
promising nodes get more. A kernel that failed a check takes no children, except that a
generator able to repair it (`repairable`) gets one repair child, ahead of the next batch's
expansions; a subtree below such a kernel is searched once a repair in it came out correct; a
correct kernel slower than the baseline is a parent like any other. Expansions are
taken in batches (`step`); a caller that keeps its workers busy launches batches while others
are being judged (`launch`, then `land` each verdict as it comes), and the nodes whose children
are in flight are not expanded again until they land.

Taken a `step` at a time, the search is deterministic given the generator, the evaluator and
the seed: ties are broken by a seeded generator, never by timing or hashing. Launched while
others are judged, the tree depends on which verdicts have landed at each launch.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass, field

from generators.base import Feedback, Parent, Proposal, Proposals


@dataclass(frozen=True)
class SearchConfig:
    batch: int = 4  # expansions evaluated together
    children_per_expansion: int = 2
    # UCT's c on max-backed rewards in [0, 1]: on the test bowl (tests/test_search.py) the
    # optimum took fewer evaluations the smaller c, down to this one (bench/NOTES.md, UCT's
    # exploration constant).
    exploration: float = 0.15
    widening: float = 1.5  # a node may hold ceil(widening * visits ** 0.5) children
    stall: int = 12  # evaluations without a new best before the site stops
    floor_fraction: float = 0.9  # stop once the best reaches this fraction of the floor speed
    seed: int = 0
    # "uct", or "random": expand a node drawn uniformly from all that can take a child, the
    # baseline the tree search is measured against.
    strategy: str = "uct"


@dataclass(eq=False)
class Node:
    proposal: Proposal | None  # None: the PyTorch reference (the root)
    parent: Node | None
    feedback: Feedback | None = None
    candidate_id: int | None = None  # in the store
    children: list[Node] = field(default_factory=list)
    visits: int = 0
    value: float = 0.0  # the best reward in its subtree: one great kernel is what counts
    exhausted: bool = False  # the generator has no more children for it

    @property
    def depth(self) -> int:
        return 0 if self.parent is None else self.parent.depth + 1

    @property
    def latency_ms(self) -> float | None:
        if self.feedback is None or not self.feedback.correct:
            return None
        return self.feedback.latency_ms


def reward(feedback: Feedback, baseline_ms: float) -> float:
    """0 for a kernel that failed a check; 0.5 at the baseline; +0.25 per doubling of speed,
    in [0, 1]: a correct kernel slower than the baseline still earns a little, as a parent."""
    if not feedback.correct or not feedback.latency_ms:
        return 0.0
    speedup = baseline_ms / feedback.latency_ms
    return min(1.0, max(0.0, 0.5 + math.log2(speedup) / 4))


Propose = Callable[[Parent | None, int], Proposals]
Evaluate = Callable[[list[Proposal]], list[Feedback]]
Record = Callable[[Node], None]
Repairable = Callable[[Proposal, Feedback], bool]


@dataclass
class SiteSearch:
    """The tree of one site. `propose`, `evaluate` and `record` connect it to the world."""

    baseline_ms: float
    floor_ms: float
    propose: Propose
    evaluate: Evaluate | None  # None: the caller judges `launch`'s children itself
    record: Record
    config: SearchConfig = SearchConfig()
    repairable: Repairable | None = None  # which rejected kernels get a repair child
    root: Node = field(default_factory=lambda: Node(None, None))
    evaluations: int = 0
    since_best: int = 0
    best: Node | None = None
    declined: str = ""  # why the generator had no drafts, if it had none
    stuck: bool = False  # no node anywhere can take another child
    # Evaluations without a new best allowed past `config.stall`: a run with time left and no
    # other site to search gives a stalled site more (`go_on`).
    patience: int = 0
    repairs: list[Node] = field(default_factory=list)  # rejected kernels awaiting a repair

    def __post_init__(self) -> None:
        self.random = random.Random(self.config.seed)

    @property
    def best_ms(self) -> float:
        return self.best.latency_ms if self.best is not None else self.baseline_ms

    @property
    def race_ms(self) -> float | None:
        """The time a candidate sent now races (`EvalConfig.race_ms`): the site's best, where
        one is known."""
        best = self.best_ms
        return best if math.isfinite(best) and best > 0 else None

    @property
    def done(self) -> bool:
        return self.at_floor or self.stuck or self.stalled

    @property
    def at_floor(self) -> bool:
        return self.best_ms <= self.floor_ms / self.config.floor_fraction

    @property
    def stalled(self) -> bool:
        """No new best in the evaluations the site was allowed without one."""
        return self.since_best >= self.config.stall + self.patience

    def go_on(self) -> None:
        """Allow a stalled search another `config.stall` evaluations without a new best."""
        self.patience += self.config.stall

    def _limit(self, node: Node) -> int:
        return max(1, math.ceil(self.config.widening * max(node.visits, 1) ** 0.5))

    def _can_grow(self, node: Node) -> bool:
        """A node takes children if it is the root or a correct kernel with more to come."""
        return not node.exhausted and (node.proposal is None or node.latency_ms is not None)

    def _uct(self, child: Node, parent: Node) -> float:
        if child.visits == 0:
            return math.inf
        explore = self.config.exploration * math.sqrt(math.log(parent.visits + 1) / child.visits)
        return child.value + explore

    def select(self, taken: set[Node]) -> Node | None:
        """The node to expand next; None when no node anywhere can take another child."""
        if self.config.strategy == "random":
            growing = [n for n in self.nodes() if self._can_grow(n) and n not in taken]
            return self.random.choice(growing) if growing else None
        return self._select(self.root, taken)

    def nodes(self) -> list[Node]:
        """Every node of the tree, the root first, depth first."""
        found, stack = [], [self.root]
        while stack:
            node = stack.pop()
            found.append(node)
            stack.extend(reversed(node.children))
        return found

    def _select(self, node: Node, taken: set[Node]) -> Node | None:
        grow = self._can_grow(node) and node not in taken
        if grow and len(node.children) < self._limit(node):
            return node
        options = [c for c in node.children if c.latency_ms is not None or c.value > 0]
        ranked = sorted(options, key=lambda c: (self._uct(c, node), self.random.random()),
                        reverse=True)
        for child in ranked:
            found = self._select(child, taken)
            if found is not None:
                return found
        # Every subtree below is spent: widen this node past its limit rather than stop.
        return node if grow else None

    def step(self, limit: int | None = None) -> int:
        """One batch of expansions judged together (`launch`, `evaluate`, `land`), at most
        `limit` kernels; returns how many were evaluated."""
        if self.evaluate is None:
            raise ValueError("this search has no evaluate: its caller judges what `launch` "
                             "gives and lands each verdict")
        expansions = self.launch(limit)
        if not expansions:
            return 0
        feedback = self.evaluate([p for _, p in expansions])
        for (parent, proposal), verdict in zip(expansions, feedback, strict=True):
            self.land(parent, proposal, verdict)
        return len(expansions)

    def launch(self, limit: int | None = None, busy: frozenset[Node] = frozenset()
               ) -> list[tuple[Node, Proposal]]:
        """The next batch of expansions, each a parent and a child to judge, at most `limit`
        kernels. `busy`: nodes whose children are being judged now, not expanded again until
        those land. Nothing to launch while nothing is busy leaves the search `stuck`."""
        limit = self.config.batch * self.config.children_per_expansion if limit is None else limit
        taken: set[Node] = set(busy)
        expansions: list[tuple[Node, Proposal]] = []
        expanded = 0
        while self.repairs and expanded < self.config.batch and len(expansions) < limit:
            node = self.repairs.pop(0)
            result = self.propose(Parent(node.proposal, node.feedback), 1)
            if result.children:
                expanded += 1
                expansions.append((node, result.children[0]))
        while expanded < self.config.batch and len(expansions) < limit:
            node = self.select(taken)
            if node is None:
                break
            taken.add(node)
            parent = None if node.proposal is None else Parent(node.proposal, node.feedback)
            wanted = min(self.config.children_per_expansion, limit - len(expansions))
            result = self.propose(parent, wanted)
            if not result.children:
                node.exhausted = True
                if node is self.root:
                    self.declined = result.declined
                continue
            expanded += 1
            expansions += [(node, p) for p in result.children]
        if not expansions and not busy:
            self.stuck = True
        return expansions

    def land(self, parent: Node, proposal: Proposal, feedback: Feedback) -> None:
        """A launched child's verdict: it joins the tree under `parent`."""
        child = Node(proposal, parent, feedback)
        self.since_best += 1
        if self._attach(child):
            self.since_best = 0
        self.record(child)
        if self.repairable is not None and not feedback.correct \
                and self.repairable(proposal, feedback):
            self.repairs.append(child)

    def rebase(self, baseline_ms: float) -> None:
        """Measure every kernel against a revised baseline: each node's reward depends on it,
        and so does the best reward its subtree backs up."""
        self.baseline_ms = baseline_ms
        for node in reversed(self.nodes()):  # every node after its descendants
            own = reward(node.feedback, baseline_ms) if node.feedback is not None else 0.0
            node.value = max([own, *(child.value for child in node.children)])

    def adopt(self, parent: Node, proposal: Proposal, feedback: Feedback,
              candidate_id: int) -> Node:
        """Put back a node evaluated in an earlier, interrupted run (nothing is recorded)."""
        child = Node(proposal, parent, feedback, candidate_id)
        self._attach(child)
        return child

    def _attach(self, child: Node) -> bool:
        """Hang `child` in the tree and back its reward up; True if it is the new best."""
        child.parent.children.append(child)
        self.evaluations += 1
        improved = child.latency_ms is not None and child.latency_ms < self.best_ms
        if improved:
            self.best = child
        gain = reward(child.feedback, self.baseline_ms)
        node: Node | None = child
        while node is not None:
            node.visits += 1
            node.value = max(node.value, gain)
            node = node.parent
        return improved


def going_on(searches: list[SiteSearch]) -> list[SiteSearch]:
    """Of searches that are all done while the run has time left, those that stopped only for
    want of a new best, each allowed as many evaluations again (`SiteSearch.go_on`): the
    budget a user gives is spent searching, not left unused."""
    stalled = [s for s in searches if s.stalled and not s.at_floor and not s.stuck]
    for search in stalled:
        search.go_on()
    return stalled
