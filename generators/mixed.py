"""Several generators in one tree (`--generator rules,llm`).

A request for `n` children is split between the generators as evenly as it goes, the odd ones
going to each generator in turn from call to call; what one cannot write (it declined, or ran
dry) passes to the next. A repair of a failed kernel goes only to the generator that wrote it.
The split depends only on the sequence of calls, so a search stays deterministic.
"""

from __future__ import annotations

from pathlib import Path

from generators.base import Feedback, Generator, Parent, Proposal, Proposals, Repairer


class MixedGenerator:
    def __init__(self, generators: list[Generator]) -> None:
        if not generators:
            raise ValueError("a mixed generator needs at least one generator")
        self.generators = generators
        self.name = ",".join(g.name for g in generators)
        self._turn = 0

    def remember(self, problem: Path, source: str) -> None:
        for generator in self.generators:
            remember = getattr(generator, "remember", None)
            if remember is not None:
                remember(problem, source)

    def close(self) -> None:
        for generator in self.generators:
            close = getattr(generator, "close", None)
            if close is not None:
                close()

    def _writer(self, proposal: Proposal) -> Generator | None:
        return next((g for g in self.generators if g.name == proposal.generator), None)

    def can_repair(self, proposal: Proposal, feedback: Feedback) -> bool:
        writer = self._writer(proposal)
        return isinstance(writer, Repairer) and writer.can_repair(proposal, feedback)

    def propose(self, problem: Path, parent: Parent | None, n: int,
                tiers: tuple[str, ...] = ("triton",)) -> Proposals:
        if parent is not None and parent.feedback is not None and not parent.feedback.correct:
            writer = self._writer(parent.proposal)
            if writer is None:
                return Proposals([], declined=f"no generator named {parent.proposal.generator}")
            return writer.propose(problem, parent, n, tiers)
        count = len(self.generators)
        order = [self.generators[(self._turn + i) % count] for i in range(count)]
        self._turn = (self._turn + 1) % count
        shares = [n // count + (1 if i < n % count else 0) for i in range(count)]
        children: list[Proposal] = []
        declined: list[str] = []
        carry = 0
        for generator, share in zip(order, shares, strict=True):
            wanted = share + carry
            if wanted == 0:
                continue
            result = generator.propose(problem, parent, wanted, tiers)
            children += result.children[:wanted]
            carry = wanted - len(result.children[:wanted])
            if not result.children and result.declined:
                declined.append(f"{generator.name}: {result.declined}")
        if children:
            return Proposals(children)
        return Proposals([], declined="; ".join(declined) or "no generator had a child")
