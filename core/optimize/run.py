"""One optimize run: profile the model, search the sites that matter, record everything.

The evaluator's workers are kept busy: each verdict that comes back lands in its site's tree,
and the next expansions go out at once, to the site with the most to gain: its share of the
model's time, times its headroom above the roofline floor, discounted by the evaluations it has
had (`core.optimize.flight`). Once a site's first batch of Triton kernels is judged, if it
still holds at least `cuda_share` of the model's remaining time, the CUDA tier joins the same
tree: its seeds and drafts hang under the Triton kernels expanded next, the best first. It
joins after one batch, not once Triton settles, because a large site judges a few
kernels a minute and its schedules with the most to gain (rows shared by a cluster, rows kept
in shared memory) are the CUDA tier's alone (bench/NOTES.md, 2026-12-06, 08:10 UTC). Every
candidate and verdict is written to the store the moment it exists.

A site whose baselines run out of device memory is left out of the search, with why. Any other
step that fails (a site's baseline, the search, the end-to-end check; out of memory, say)
ends the run as failed, with what it judged kept and reported; Ctrl-C leaves it interrupted
(`core.optimize.interrupt`). Either can be resumed, to the run's own budget: the minutes it
already ran count.
"""

from __future__ import annotations

import hashlib
import math
import platform
import time
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from core.evaluate import EvalConfig, Evaluator, Verdict
from core.evaluate.memory import JUDGE_FACTOR, device_step, model_bytes, problem_bytes
from core.evaluate.site_baseline import time_site
from core.optimize.config import OptimizeConfig, minutes_spent, run_settings
from core.optimize.counter_reads import CounterReads
from core.optimize.e2e import EndToEnd, EndToEndCheck
from core.optimize.flight import Flight, Pending
from core.optimize.interrupt import GracefulStop
from core.optimize.report import note_declines
from core.optimize.site_run import (
    SiteRun,
    feedback_of,
    headroom_ms,
    site_priority,
    with_best,
)
from core.profile.pipeline import ProfiledModel, profile_sites
from core.profile.progress import Progress
from core.profile.sites import Site
from core.runtime.errors import KilnInputError, error_line, out_of_memory
from core.search.tree import Node, SiteSearch, going_on
from core.timing.device_lock import device_lock_path, shared_device
from core.timing.precision import fp32_matmuls
from generators.base import Generator, Parent, Proposal, Proposals, Repairer
from generators.llm.config import LlmCall
from generators.mixed import MixedGenerator
from generators.rules import RulesGenerator
from store import Candidate, Store

if TYPE_CHECKING:
    from core.evaluate.ray_executor import RayEvaluator


def _versions() -> dict[str, str]:
    import triton

    return {"torch": torch.__version__, "triton": triton.__version__,
            "python": platform.python_version(), "cuda": str(torch.version.cuda)}


def _gpu(device: str) -> str:
    return torch.cuda.get_device_name() if device == "cuda" else "cpu"


class OptimizeRun:
    def __init__(self, config: OptimizeConfig, progress: Progress) -> None:
        self.config = config
        self.progress = progress
        self.store = Store.open(config.db, create=True)
        self.run_id: int | None = None
        self.site_of_problem: dict[Path, int] = {}
        self.generator = self._generator()
        self.started = time.perf_counter()
        self.spent_minutes = 0.0  # what a resumed run ran before this process took it over
        self.evaluated = 0
        self.stop = GracefulStop(progress)
        self.counter_reads = CounterReads(config.counters if config.feedback else 0,
                                          self.store.add_verdict, progress.step)

    def _generator(self) -> Generator:
        made: list[Generator] = []
        for name in self.config.generators:
            if name == "rules":
                made.append(RulesGenerator(allow_tf32=self.config.profile.allow_tf32))
            elif name == "llm":
                from generators.llm.generator import (
                    LLMGenerator,  # the OpenAI SDK only when asked for
                )

                made.append(LLMGenerator(self.config.llm, record=self._record_call,
                                         notify=self.progress.step,
                                         peaks=self.config.profile.peaks))
            else:
                raise KilnInputError(f"unknown generator {name!r}",
                                     "pass --generator rules, llm or rules,llm")
        return made[0] if len(made) == 1 else MixedGenerator(made)

    def _record_call(self, problem: Path, call: LlmCall) -> int:
        return self.store.add_llm_call(
            self.run_id, model=call.model, prompt=call.prompt, reply=call.reply,
            prompt_tokens=call.prompt_tokens, completion_tokens=call.completion_tokens,
            latency_ms=call.latency_ms, cost_usd=call.cost_usd,
            site_id=self.site_of_problem.get(problem.resolve()), error=call.error)

    def _evaluator(self, eval_config: EvalConfig) -> Evaluator | RayEvaluator:
        if self.config.executor == "ray":
            from core.evaluate.ray_executor import RayEvaluator  # Ray only when asked for

            return RayEvaluator(eval_config, self.config.ray_address)
        return Evaluator(eval_config, workers=self.config.workers)

    def _site_run(self, site: Site, site_id: int) -> SiteRun:
        problem = site.folder / "problem.py"
        self.site_of_problem[problem.resolve()] = site_id
        holder: dict[str, SiteRun] = {}

        def propose(parent: Parent | None, n: int) -> Proposals:
            return self.generator.propose(problem, parent, n, holder["run"].tiers)

        def record(node: Node) -> None:
            run = holder["run"]
            parent = node.parent.candidate_id if node.parent is not None else None
            proposal = node.proposal
            with self.store.batch():
                new = self.store.add_candidate(
                    site_id, parent_id=parent, tier=proposal.tier,
                    generator=proposal.generator, rationale=proposal.rationale,
                    source=proposal.source, settings=proposal.settings,
                    llm_call_id=proposal.llm_call_id)
                node.candidate_id = new.id
                run.stored[new.id] = run.verdicts.pop(id(proposal))
                self.store.add_verdict(new.id, run.stored[new.id])

        repairable = self.generator.can_repair if isinstance(self.generator, Repairer) \
            else None
        # Its candidates are judged as they are launched (`_search`), not a batch at a time.
        search = SiteSearch(math.inf, site.cost.floor_ms, propose, None, record,
                            self.config.search, repairable)
        # Triton first where the run has it; a run of the CUDA tier alone starts there.
        first = ("triton",) if "triton" in self.config.tiers else tuple(self.config.tiers)
        run = SiteRun(site, site_id, search, first)
        holder["run"] = run
        return run

    def _out_of_budget(self) -> bool:
        minutes = self.spent_minutes + (time.perf_counter() - self.started) / 60
        return (self.evaluated >= self.config.max_candidates
                or minutes >= self.config.budget_minutes)

    def _maybe_add_cuda(self, run: SiteRun, total_ms: float) -> bool:
        """Open the CUDA tier for a site, past its first round, that still holds a large
        share."""
        if "cuda" not in self.config.tiers or "cuda" in run.tiers:
            return False
        if not math.isfinite(run.search.baseline_ms) or total_ms <= 0:
            return False
        remaining_ms = run.site.time_ms * run.search.best_ms / run.search.baseline_ms
        if remaining_ms / total_ms < self.config.cuda_share:
            return False
        run.tiers = ("triton", "cuda")
        run.search.stuck, run.search.since_best = False, 0
        if run.search.best is not None:
            run.search.best.exhausted = False  # CUDA drafts hang under the best Triton kernel
        return True

    def execute(self, resume: int | None = None) -> dict[str, object]:
        """Run the search; with `resume`, continue that interrupted run of the store."""
        config = self.config
        state = None
        if resume is not None:
            self.run_id = resume
            self.spent_minutes = minutes_spent(self.store.run(resume))
            state = self.store.resume_run(resume)
        self.progress.step("profiling")
        whole = JUDGE_FACTOR * model_bytes(config.profile.model)
        with device_step(config.profile.device, whole):
            profiled = profile_sites(config.profile)
            # The search needs the GPU, the end-to-end check the inputs: they wait in host
            # memory until then.
            profiled.loaded.move_inputs("cpu")
        report = profiled.report
        if state is None:
            run_id = self.store.start_run(
                model_spec=config.profile.model, model_hash=_model_hash(profiled),
                gpu=_gpu(config.profile.device), versions=_versions(),
                config=run_settings(config))
            site_ids = self._add_sites(run_id, profiled)
        else:
            run_id = state.run.id
            site_ids = {site.key: site.id for site in state.sites}
            missing = [s.key for s in profiled.table.sites if s.key not in site_ids]
            if missing:
                raise KilnInputError(
                    f"run {run_id}'s model no longer cuts into the same sites ({missing[0]} is "
                    "new): it changed since the run started",
                    "start a new run for the changed model")
        self.run_id = run_id
        total = float(report["captured_ms"])
        # A resumed run ranks its sites by the times it measured when it started, so that it
        # goes on with the sites it chose then, however the new profile's timings wander.
        times = ({s.key: (s.time_ms, s.floor_ms) for s in state.sites} if state is not None
                 else {s.key: (s.time_ms, s.floor_ms) for s in profiled.table.sites})
        chosen = sorted((s for s in profiled.table.sites if s.family != "other"),
                        key=lambda s: -headroom_ms(*times[s.key]))
        chosen = chosen[: config.sites]
        eval_config = config.eval_config()
        runs: list[SiteRun] = []
        e2e: dict[str, object] | None = None
        failure = ""
        doing = "timing the sites' baselines"
        try:
            with self._evaluator(eval_config) as evaluator, self.stop.deferred():
                runs = [self._site_run(s, site_ids[s.key]) for s in chosen]
                stored = {s.id: s for s in state.sites} if state is not None else {}
                self._baselines(runs, stored, eval_config)
                doing = "searching"
                if state is not None:
                    self._restore(runs, state.candidates, evaluator)
                self._search(runs, total, evaluator)
                self.counter_reads.flush(runs, evaluator)
            self.stop.check()
            if config.e2e:
                doing = "checking the model end to end"
                with device_step(config.profile.device, whole):
                    e2e = self._end_to_end(profiled, runs, total).to_dict()
        except KeyboardInterrupt:
            self.store.heartbeat(run_id)  # the last moment it ran, for the resumed budget
            raise
        except KilnInputError:
            self.store.finish_run(run_id, status="failed")
            raise
        except Exception as err:  # out of memory, say: what was judged is kept and reported
            failure = f"while {doing}: {error_line(err)}"
            if doing == "checking the model end to end":
                e2e = {"error": error_line(err)}
        finally:
            close = getattr(self.generator, "close", None)
            if close is not None:
                close()
        # A failed run keeps why with its end-to-end record, for `python -m store` and the app.
        stored_e2e = {**(e2e or {}), "failure": failure} if failure else e2e
        self.store.finish_run(run_id, status="failed" if failure else "done", e2e=stored_e2e)
        return {**report, "run_id": run_id, "db": str(config.db),
                "report_md": str(config.profile.out / profiled.loaded.name
                                 / f"report-run{run_id}.md"),
                "resumed": state is not None, "status": "failed" if failure else "done",
                "failure": failure, "allow_tf32": config.profile.allow_tf32,
                "searched": [r.result() for r in runs],
                "sites": [with_best(s, runs) for s in report["sites"]],
                "e2e": e2e}

    def _baselines(self, runs: list[SiteRun], stored: dict[int, object],
                   eval_config: EvalConfig) -> None:
        """Each site's eager and compiled times (eager only under --no-site-compile), measured
        once (kept across a resume). A site whose baselines do not fit in the device's memory
        is left out of the search, with why."""
        compiled = self.config.site_compile
        for run in runs:
            self.stop.check()
            site = stored.get(run.site_id)
            if site is not None and site.eager_ms is not None and (
                    site.compile_ms is not None or not compiled):
                run.note_baseline(site.eager_ms, site.compile_ms)
                continue
            self.progress.step(f"{run.site.key}: timing PyTorch eager"
                               + (" and torch.compile" if compiled else ""))
            problem = run.problem
            try:
                with device_step(eval_config.device, problem_bytes(problem).needed):
                    baseline = time_site(problem, eval_config, compiled)
            except Exception as err:
                if not out_of_memory(err):
                    raise
                why = f"ran out of device memory timing its PyTorch baselines: {error_line(err)}"
                self.progress.step(f"{run.site.key}: left out of the search, {why}")
                self.store.set_site_declined(run.site_id, why)
                run.search.declined, run.search.stuck = why, True
                continue
            self.store.set_site_baselines(run.site_id, eager_ms=baseline.eager_ms,
                                          compile_ms=baseline.compile_ms)
            run.note_baseline(baseline.eager_ms, baseline.compile_ms)
        for note in filter(None, (run.at_floor_note() for run in runs)):
            self.progress.step(note)

    def _end_to_end(self, profiled: ProfiledModel, runs: list[SiteRun],
                    total_ms: float) -> EndToEnd:
        """The winners installed in the model, checked and timed against eager and compile."""
        torch._dynamo.reset()  # the capture's compiled graphs are not the ones to time
        loaded = profiled.loaded
        loaded.move_inputs(loaded.device)
        allow_tf32 = self.config.profile.allow_tf32
        tf32 = allow_tf32 or any(s.family == "conv" for s in profiled.table.sites)
        device = self.config.profile.device
        # Its installs, compiles and output checks share the GPU with other runs' checks, and
        # none of them runs under another run's timing (nor theirs under its timings).
        with shared_device(device_lock_path(device)), fp32_matmuls(allow_tf32):
            check = EndToEndCheck(loaded.model, loaded.inputs, device, tf32, self.progress)
            result = check.run(total_ms, [w for r in runs if (w := r.winner) is not None])
        return replace(result, floor_ms=float(profiled.report["floor_ms"]))

    def _add_sites(self, run_id: int, profiled: ProfiledModel) -> dict[str, int]:
        site_ids = {}
        for record in note_declines(profiled.report)["sites"]:
            site = next(s for s in profiled.table.sites if s.key == record["id"])
            site_ids[site.key] = self.store.add_site(
                run_id, key=site.key, family=site.family, signature=site.problem.signature,
                ops=list(site.problem.ops), calls=site.calls, share=record["share"],
                time_ms=site.time_ms, eager_ms=None, compile_ms=None, floor_ms=site.floor_ms,
                problem_source=site.problem.source, declined=record.get("declined"))
        return site_ids

    def _restore(self, runs: list[SiteRun], stored: list[Candidate],
                 evaluator: Evaluator | RayEvaluator) -> None:
        """Hang the stored candidates back in their trees; judge any the dead writer had not."""
        by_site = {run.site_id: run for run in runs}
        nodes: dict[int, Node] = {}
        for candidate in sorted(stored, key=lambda c: c.id):
            self.evaluated += 1
            run = by_site.get(candidate.summary.site_id)
            if run is None:
                continue
            problem = run.problem
            proposal = Proposal(candidate.source, candidate.summary.tier,
                                candidate.summary.generator, candidate.summary.rationale,
                                candidate.settings or {})
            self.generator.remember(problem, candidate.source)
            if candidate.verdict is None:
                verdict = evaluator.evaluate(problem, candidate.source)
                self.store.add_verdict(candidate.id, verdict)
            else:
                verdict = Verdict.from_dict(candidate.verdict)
            feedback = feedback_of(verdict, run.site.cost.floor_ms, self.config.feedback)
            run.note_baseline(verdict.baseline_ms)
            run.stored[candidate.id] = verdict
            if verdict.counters is not None:
                run.profiled.add(candidate.id)
            parent = nodes.get(candidate.summary.parent_id, run.search.root)
            nodes[candidate.id] = run.search.adopt(parent, proposal, feedback, candidate.id)
            if proposal.tier == "cuda":
                run.tiers = ("triton", "cuda")

    def _search(self, runs: list[SiteRun], total_ms: float,
                evaluator: Evaluator | RayEvaluator) -> None:
        """Keep the evaluator's workers busy (`core.optimize.flight`): each verdict that comes
        back lands in its site's tree, and the next expansions go out with it known."""
        flight = Flight(evaluator)
        try:
            while True:
                if self.stop.requested or self._out_of_budget():
                    flight.cancel_queued()  # what the workers hold lands and is stored
                else:
                    self._fill(runs, total_ms, flight)
                if not flight:
                    self.stop.check()
                    if self._out_of_budget() or not self._go_on(runs):
                        return
                    continue
                for pending, verdict in flight.landed():
                    self._land(pending, verdict)
        except KeyboardInterrupt:  # not deferred (a run outside the main thread)
            flight.stop()
            raise

    def _fill(self, runs: list[SiteRun], total_ms: float, flight: Flight) -> None:
        """Launch expansions, and counter reads of the best kernels, until the flight is full:
        the site with the most to gain first."""
        blocked: set[int] = set()  # sites with nothing to launch until something lands
        while flight.room > 0:
            for run in runs:
                if run.search.done or run.steps > 0:
                    self._maybe_add_cuda(run, total_ms)
            open_runs = [r for r in runs if not r.search.done and id(r) not in blocked]
            if not open_runs:
                return
            run = max(open_runs, key=lambda r: site_priority(r, total_ms))
            due = self.counter_reads.due(run, flight.reads(run))
            if due and flight.may_read():
                flight.read(run, due[0])
                continue
            limit = min(flight.room,
                        self.config.max_candidates - self.evaluated - flight.candidates)
            expansions = run.search.launch(limit, flight.busy(run)) if limit > 0 else []
            if expansions:
                flight.launch(run, expansions)
                continue
            blocked.add(id(run))
            if run.search.stuck and not run.search.evaluations:
                self._say_step(run)

    def _land(self, pending: Pending, verdict: Verdict) -> None:
        run = pending.run
        if pending.proposal is None:
            self.counter_reads.merge(run, [pending.node], [verdict])
            return
        run.verdicts[id(pending.proposal)] = verdict
        run.note_baseline(verdict.baseline_ms)
        feedback = feedback_of(verdict, run.site.cost.floor_ms, self.config.feedback)
        run.search.land(pending.node, pending.proposal, feedback)
        self.evaluated += 1
        assert pending.launch is not None
        pending.launch.left -= 1
        if pending.launch.left:
            return
        run.steps += 1
        self._say_step(run)

    def _say_step(self, run: SiteRun) -> None:
        best = run.search.best
        speed = run.search.baseline_ms / best.latency_ms if best else 1.0
        self.progress.step(
            f"{run.site.key}: {run.search.evaluations} evaluated, best "
            + (f"{speed:.2f}x ({best.proposal.tier})" if best else "PyTorch (1.00x)")
            + (f"; no kernels: {run.search.declined}"
               if run.search.declined and not run.search.evaluations else ""))

    def _go_on(self, runs: list[SiteRun]) -> bool:
        """Every site is done, but the run has time left: the sites that stopped for want of a
        new best search on (`going_on`); False if none did."""
        stalled = {id(s) for s in going_on([r.search for r in runs])}
        for run in (r for r in runs if id(r.search) in stalled):
            self.progress.step(f"{run.site.key}: no new best in {run.search.since_best} "
                               "evaluations; the budget has time left, so its search goes on")
        return bool(stalled)


def _model_hash(profiled: ProfiledModel) -> str:
    text = "\n".join(sorted(s.key for s in profiled.table.sites))
    return hashlib.sha256(text.encode()).hexdigest()[:16]
