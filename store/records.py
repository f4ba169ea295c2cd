"""What the store hands back: runs, sites, candidates, LLM calls, versions; frozen dataclasses."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from typing import Any

from store.labels import CPU_TIMINGS, cpu_timings, verdict_label


def utc_now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds")


@dataclass(frozen=True)
class Run:
    id: int
    model_spec: str
    model_hash: str
    gpu: str
    versions: dict[str, Any]
    config: dict[str, Any]
    # 'interrupted' also when the row still says 'running' but its writer is dead and no
    # writer has opened the store since to record it.
    status: str
    started_at: str
    finished_at: str | None
    heartbeat_at: str
    writer_host: str
    writer_pid: int
    resumes: int
    e2e: dict[str, Any] | None
    sites: int
    candidates: int
    accepted: int  # candidates whose verdict reads "accepted" (store.labels)

    @property
    def cpu_timings(self) -> bool:
        """Whether its timings are the CPU's: indicative, never a GPU speedup."""
        return cpu_timings(self.gpu)

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "timings_note": CPU_TIMINGS if self.cpu_timings else None}


@dataclass(frozen=True)
class Site:
    id: int
    run_id: int
    key: str
    family: str
    signature: str
    ops: list[str]
    calls: int
    share: float
    time_ms: float | None
    eager_ms: float | None
    compile_ms: float | None
    floor_ms: float | None
    problem_source: str
    declined: str | None = None  # why the kernel compiler could not plan the site

    @property
    def baseline_ms(self) -> float | None:
        """The time a kernel must beat: the faster of eager and torch.compile."""
        times = [t for t in (self.eager_ms, self.compile_ms) if t is not None]
        return min(times) if times else None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class CandidateSummary:
    """One row of a candidate listing; the verdict fields are None until it has a verdict."""

    id: int
    parent_id: int | None
    site_id: int
    run_id: int
    site_key: str
    family: str
    tier: str
    generator: str
    rationale: str
    created_at: str
    compiled: bool | None
    correct: bool | None
    accepted: bool | None
    latency_ms: float | None
    speedup: float | None
    speedup_vs_eager: float | None
    speedup_vs_compile: float | None
    roofline_fraction: float | None
    reason: str | None
    reason_code: str | None
    # A search result's matching passage, markers around the matched terms.
    snippet: str | None = None

    @property
    def verdict_label(self) -> str:
        """The verdict in one of `store.VERDICTS`: "accepted" only when correct and faster."""
        return verdict_label(
            self.compiled, self.correct, self.accepted, self.reason_code, self.speedup
        )

    def to_dict(self) -> dict[str, Any]:
        row = {**asdict(self), "verdict_label": self.verdict_label}
        if self.snippet is None:
            del row["snippet"]
        return row


@dataclass(frozen=True)
class Candidate:
    summary: CandidateSummary
    source: str
    source_hash: str
    llm_call_id: int | None
    # The evaluator's latest verdict exactly as it was stored, every field included.
    verdict: dict[str, Any] | None
    settings: dict[str, Any] | None = None  # the generator's knobs for this kernel

    @property
    def id(self) -> int:
        return self.summary.id

    def to_dict(self) -> dict[str, Any]:
        return {
            **self.summary.to_dict(),
            "source": self.source,
            "source_hash": self.source_hash,
            "llm_call_id": self.llm_call_id,
            "verdict": self.verdict,
            "settings": self.settings,
        }


@dataclass(frozen=True)
class Judging:
    """Where the time of judging one candidate went, from its latest verdict.

    `phase_seconds` holds any of `PHASES`; verdicts of an older Kiln hold none.
    """

    candidate_id: int
    site_id: int
    proposed_at: str
    judged_at: str
    eval_seconds: float | None
    phase_seconds: dict[str, float]
    peak_memory_bytes: int | None


# The phases of judging a candidate in the order they happen (core.evaluate's pool and judge);
# the waits for the device lock, spread over the checks and the timing, last.
PHASES = ("worker start", "waiting for memory", "candidate start", "compile", "checks", "timing",
          "counters", "ending", "waiting for the device")


def ordered_phases(names: Iterable[str]) -> list[str]:
    """`names` in the order of `PHASES`; a phase a later evaluator adds comes after, by name."""
    present = set(names)
    return [p for p in PHASES if p in present] + sorted(present - set(PHASES))


@dataclass(frozen=True)
class NewCandidate:
    """What `Store.add_candidate` did: `duplicate` when the site already held this source."""

    id: int
    duplicate: bool


@dataclass(frozen=True)
class LlmCall:
    id: int
    run_id: int
    site_id: int | None
    model: str
    prompt: str
    reply: str | None
    prompt_tokens: int | None
    completion_tokens: int | None
    latency_ms: float | None
    cost_usd: float | None
    error: str | None
    created_at: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class RunState:
    """Everything a resumed search needs to rebuild its tree of a run."""

    run: Run
    sites: list[Site]
    candidates: list[Candidate]

    @property
    def unevaluated(self) -> list[Candidate]:
        """Candidates whose evaluation the dead writer never finished."""
        return [c for c in self.candidates if c.verdict is None]


@dataclass(frozen=True)
class RunHeartbeat:
    """A run whose row says it is running: its last heartbeat and whether its writer lives."""

    run_id: int
    heartbeat_at: str
    writer_alive: bool


@dataclass(frozen=True)
class StoreVersion:
    """What changes whenever anything is written, a run finishes, or a run's writer dies.

    Equal versions mean the store reads the same: the app caches its queries under one.
    """

    # The highest id of runs, sites, candidates, verdicts and LLM calls; None for an empty table.
    last_ids: tuple[int | None, ...]
    last_finished_at: str | None
    running: tuple[RunHeartbeat, ...]

    @property
    def has_runs(self) -> bool:
        return self.last_ids[0] is not None

    def writing(self, run_id: int | None = None) -> bool:
        """Whether a run (this one, or any) is being written right now."""
        return any(beat.writer_alive and run_id in (None, beat.run_id) for beat in self.running)
