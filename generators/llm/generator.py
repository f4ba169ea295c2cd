"""The LLM generator: a chat model drafts, repairs, refines and translates kernels.

Each child is one chat request (the `n` of a `propose` go out together, `concurrency` at a
time). A reply whose code cannot go to the evaluator (no code block, no `ModelNew`, a static
rule broken) is sent straight back with the problems, within the chain's repair budget; a
kernel that fails to compile or to match the reference becomes a failed node the search hangs
a repair under (`can_repair`). Every request, answered or not, is handed to `record`, in the
calling thread, in order. When the endpoint is dead (unreachable, refusing, out of retries)
the generator declines everything from then on, and says why once through `notify`.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from core.profile.roofline import GpuPeaks
from generators.base import Feedback, Parent, Proposal, Proposals, source_digest
from generators.llm.client import ChatClient, EndpointError, RequestRejected
from generators.llm.config import LlmCall, LlmConfig
from generators.llm.prompt import (
    TARGETS,
    TIER_NAMES,
    describe_feedback,
    describe_inputs,
    gpu_facts,
    numbered,
    rationale_of,
    screen_reply,
    template,
)

RecordCall = Callable[[Path, LlmCall], int | None]  # returns the stored call's id


@dataclass
class Answer:
    """What one chain of requests produced: the calls made and the usable source, if any."""

    calls: list[LlmCall] = field(default_factory=list)
    source: str | None = None
    rationale: str = ""
    repairs: int = 0
    problems: list[str] = field(default_factory=list)
    error: EndpointError | None = None



class LLMGenerator:
    name = "llm"

    def __init__(self, config: LlmConfig, record: RecordCall | None = None,
                 notify: Callable[[str], None] | None = None,
                 peaks: GpuPeaks | None = None) -> None:
        self.config = config
        self.client = ChatClient(config)
        self.record = record
        self.notify = notify
        self.peaks = peaks or GpuPeaks()
        self.pool = ThreadPoolExecutor(max_workers=max(1, config.concurrency),
                                       thread_name_prefix="kiln-llm")
        self.dead = ""  # why the endpoint can no longer be used
        self._fatal: EndpointError | None = None  # seen by requests still queued
        self._inputs: dict[Path, str] = {}
        self._seen: dict[Path, set[str]] = {}

    def close(self) -> None:
        self.pool.shutdown(wait=True)

    def remember(self, problem: Path, source: str) -> None:
        """A source proposed before (in an earlier, interrupted run): never propose it again."""
        self._seen.setdefault(problem.resolve(), set()).add(source_digest(source))

    def can_repair(self, proposal: Proposal, feedback: Feedback) -> bool:
        """A failed kernel of this generator gets a repair child while its chain has budget."""
        repairs = int(proposal.settings.get("repairs", 0))
        return (proposal.generator == self.name and not feedback.correct and not self.dead
                and repairs < self.config.max_repairs)

    def propose(self, problem: Path, parent: Parent | None, n: int,
                tiers: tuple[str, ...] = ("triton",)) -> Proposals:
        if self.dead:
            return Proposals([], declined=self.dead)
        problem = problem.resolve()
        task = self._task(parent, tiers)
        if task is None:
            return Proposals([], declined="the LLM repairs only its own kernels")
        kind, tier = task
        problem_source = problem.read_text()
        messages = [{"role": "system", "content": template("system").substitute()},
                    {"role": "user", "content": self._prompt(kind, tier, problem,
                                                             problem_source, parent)}]
        repairs = int(parent.proposal.settings.get("repairs", 0)) + 1 \
            if kind == "repair" and parent is not None else 0
        futures = [self.pool.submit(self._ask, messages, problem_source, repairs)
                   for _ in range(n)]
        answers = [f.result() for f in futures]
        return self._proposals(problem, answers, kind, tier)

    def _task(self, parent: Parent | None, tiers: tuple[str, ...]) -> tuple[str, str] | None:
        """What to ask for (draft, repair, refine, translate) and in which tier."""
        if parent is None:
            return "draft", "triton" if "triton" in tiers else "cuda"
        feedback = parent.feedback
        if feedback is not None and not feedback.correct:
            return ("repair", parent.proposal.tier) \
                if parent.proposal.generator == self.name else None
        if "cuda" in tiers and parent.proposal.tier == "triton":
            return "translate_cuda", "cuda"
        return "refine", parent.proposal.tier

    def _prompt(self, kind: str, tier: str, problem: Path, problem_source: str,
                parent: Parent | None) -> str:
        if problem not in self._inputs:
            self._inputs[problem] = describe_inputs(problem)
        fields = {"problem": problem_source.rstrip(), "shapes": self._inputs[problem],
                  "gpu": gpu_facts(self.peaks), "tier_name": TIER_NAMES[tier],
                  "target": TARGETS[tier]}
        if parent is not None:
            fields |= {"source": parent.proposal.source.rstrip(),
                       "numbered": numbered(parent.proposal.source),
                       "feedback": describe_feedback(parent.feedback)}
        return template(kind).substitute(fields)

    def _ask(self, messages: list[dict[str, str]], problem_source: str,
             repairs: int) -> Answer:
        """One request, re-asked with the problems while the reply cannot be evaluated."""
        answer = Answer(repairs=repairs)
        while True:
            if self._fatal is not None:
                answer.error = self._fatal
                return answer
            try:
                call, failed = self.client.complete(messages)
            except EndpointError as error:
                answer.calls += error.calls
                answer.error = error
                if not isinstance(error, RequestRejected):
                    self._fatal = error
                return answer
            answer.calls += [*failed, call]
            screened = screen_reply(call.reply or "", problem_source)
            answer.source, answer.problems = screened.source, screened.problems
            answer.rationale = rationale_of(call.reply or "", "")
            if screened.ok or answer.repairs >= self.config.max_repairs:
                return answer
            answer.repairs += 1
            messages = [*messages, {"role": "assistant", "content": call.reply or ""},
                        {"role": "user", "content": template("fix_reply").substitute(
                            problems="\n".join(f"- {p}" for p in screened.problems))}]

    def _proposals(self, problem: Path, answers: list[Answer], kind: str,
                   tier: str) -> Proposals:
        seen = self._seen.setdefault(problem, set())
        children: list[Proposal] = []
        reasons: list[str] = []
        for answer in answers:
            call_id = None
            for call in answer.calls:
                call_id = self.record(problem, call) if self.record else None
            if answer.error is not None:
                reasons.append(str(answer.error))
                if not isinstance(answer.error, RequestRejected):
                    self._die(str(answer.error))
                continue
            if answer.source is None:
                reasons.append("; ".join(answer.problems))
                continue
            digest = source_digest(answer.source)
            if digest in seen:
                reasons.append("the model repeated a kernel it had written before")
                continue
            seen.add(digest)
            why = answer.rationale or f"{kind.replace('_', ' ')} by {self.config.model}"
            children.append(Proposal(
                answer.source, tier, self.name, why,
                {"llm": kind, "model": self.config.model, "repairs": answer.repairs},
                llm_call_id=call_id))
        if children:
            return Proposals(children)
        return Proposals([], declined=self.dead or (reasons[0] if reasons else "no reply"))

    def _die(self, reason: str) -> None:
        if self.dead:
            return
        self.dead = (f"the LLM generator stopped: {reason.rstrip('.')}. The search goes on "
                     "without it; check --llm-base-url / OPENAI_BASE_URL, OPENAI_API_KEY "
                     "and --llm-model")
        if self.notify is not None:
            self.notify(self.dead)
