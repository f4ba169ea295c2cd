"""The generator interface every kernel writer speaks: a site in, candidate sources out.

Given a site (its problem file), a parent candidate or none, and the feedback on the parent,
a generator proposes up to N children, each a `ModelNew` source with its tier, the
generator's name and a one-line rationale. A generator that cannot handle a site says why
instead of proposing nothing silently.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol, runtime_checkable


@dataclass(frozen=True)
class Feedback:
    """What the evaluator (and later the profiler) said about a candidate."""

    correct: bool  # passed every check; whether it is also faster is in its speedup
    reason: str = ""
    latency_ms: float | None = None
    baseline_ms: float | None = None
    floor_ms: float | None = None
    compile_log: str = ""
    diagnosis: str = ""  # why it is slow, a `core.evaluate.diagnosis` line: "spilling: ..."

    @property
    def speedup(self) -> float | None:
        if self.latency_ms and self.baseline_ms:
            return self.baseline_ms / self.latency_ms
        return None


@dataclass(frozen=True)
class Proposal:
    source: str
    tier: str  # "triton" or "cuda"
    generator: str
    rationale: str
    settings: dict[str, object] = field(default_factory=dict)  # the writer's knobs
    llm_call_id: int | None = None  # the stored chat request that wrote it, if one did


@dataclass(frozen=True)
class Parent:
    proposal: Proposal
    feedback: Feedback | None = None


@dataclass(frozen=True)
class Proposals:
    children: list[Proposal]
    declined: str = ""  # why there are no children, when there are none


class Generator(Protocol):
    name: str

    def propose(self, problem: Path, parent: Parent | None, n: int,
                tiers: tuple[str, ...] = ("triton",)) -> Proposals: ...


@runtime_checkable
class Repairer(Protocol):
    """A generator that can write a repair child under one of its failed kernels."""

    def can_repair(self, proposal: Proposal, feedback: Feedback) -> bool: ...


def source_digest(source: str) -> str:
    """A candidate's identity for "proposed before": the hash of its source."""
    return hashlib.sha256(source.encode()).hexdigest()
