"""The end-to-end claim: winners installed in the whole model, checked and timed.

The installed model is checked against eager on fresh inputs by the evaluator's tolerance
rules. Every timing compares two models, timed in turns, round after round, by the evaluator's
timing rules in one process, so a clock or a load that drifts hits both alike. Whatever Kiln did
not beat stays fast: the rest of the model goes to inductor, or stays eager when the compiled
model is the slower one. Kernels join the model one at a time, the most promising first, and
each stays only if the model with it beats the model without it by more than the spread of the
rounds; the report says why each other one was taken out. The Amdahl prediction from the sites'
own speedups sits next to the measured speedup. With no kernel installed the model is its own
baseline, 1.00x by definition.
"""

from __future__ import annotations

import contextlib
import statistics
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

import torch
import torch.nn as nn
from torch.utils._pytree import tree_map

from core.evaluate.config import EvalConfig
from core.evaluate.correctness import compare_outputs, dtype_tolerances
from core.evaluate.exact_reference import (
    FULL_PRECISION,
    as_close_as_pytorch,
    exact_answer,
    no_room_for_exact,
)
from core.evaluate.verdict import Reason
from core.optimize.kernel_diff import describe, kernel_times
from core.profile.in_situ import steady_threads
from core.profile.progress import Progress
from core.runtime.errors import error_line
from core.runtime.guarded import SiteKernel
from core.runtime.install import InstalledModel, install
from core.runtime.site_problem import moments
from core.runtime.tracing import set_tracing_rules
from core.timing.device_lock import device_lock_path, exclusive_device
from core.timing.model_timing import rotation_copies, time_model

FRESH_SEEDS = (101, 102, 103)
# Rounds of a comparison, each timing both models: enough for a median and a spread that a
# single slow round does not set, few enough that checking five kernels stays within minutes.
ROUNDS = 5
# Where torch.compile itself lands outside the evaluator's tolerance of eager (a deep bf16 model:
# GPT-2 small's logits on an H200), the installed model may deviate as far as this many times
# compile's worst element. There, with one matmul kernel of Kiln's or the other, the worst
# element stayed close to compile's (bench/results/suite_h200_pass1.md, GPT-2).
COMPILE_NOISE_FACTOR = 1.5
# What the reports say of CPU timings (the Triton interpreter, a CPU others share), and of a
# model with no kernel of Kiln's.
INDICATIVE = "CPU timings, indicative only: no speedup is claimed from them"
NOTHING_INSTALLED = "No kernel of Kiln's installed, the model runs as it did: 1.00x"


@dataclass(frozen=True)
class Deviation:
    """How far a model's outputs land from eager's on the fresh inputs, over every seed."""

    mismatch: str  # the first element outside the evaluator's tolerance; '' if none
    max_abs_err: float
    max_rel_err: float  # relative to the reference output's scale, as the tolerance is


@dataclass(frozen=True)
class Comparison:
    """Two models timed in turns: each one's median over the rounds, and the spread, the wider
    range of either one's rounds."""

    with_ms: float
    without_ms: float
    spread_ms: float

    @staticmethod
    def of(with_rounds: list[float], without_rounds: list[float]) -> Comparison:
        spread = max(max(r) - min(r) for r in (with_rounds, without_rounds))
        return Comparison(statistics.median(with_rounds), statistics.median(without_rounds),
                          spread)

    @property
    def pays(self) -> bool:
        """Faster with it, by more than the measurements move from round to round."""
        return self.without_ms - self.with_ms > self.spread_ms

    def why_not(self) -> str:
        return (f"the model took {self.with_ms:.4f} ms with it, {self.without_ms:.4f} ms "
                f"without (medians of {ROUNDS} rounds timed in turns), not faster by more than "
                f"the rounds' spread of {self.spread_ms:.4f} ms")


@dataclass(frozen=True)
class SiteGain:
    """A winning kernel with what it should save: its site's time and speedup against eager."""

    kernel: SiteKernel
    time_ms: float
    speedup_vs_eager: float

    @property
    def saved_ms(self) -> float:
        return self.time_ms * (1 - 1 / self.speedup_vs_eager)


@dataclass
class EndToEnd:
    correct: bool
    reason: str  # empty when correct
    max_abs_err: float
    max_rel_err: float
    eager_ms: float
    optimized_ms: float
    compile_ms: float
    speedup_vs_eager: float
    speedup_vs_compile: float
    predicted_speedup: float  # Amdahl, from the installed sites' speedups against eager
    compile_max_rel_err: float  # torch.compile's own worst element against eager
    rest: str  # what ran the ops without a kernel: "inductor" or "eager"
    timing: str  # "gpu" or "cpu"
    installed: list[str] = field(default_factory=list)  # site keys whose kernels ran
    removed: dict[str, str] = field(default_factory=dict)  # site key: why it was taken out
    calls: dict[str, int] = field(default_factory=dict)  # kernel calls and fallbacks
    # site key: why its kernel ran through its custom op, not traced into inductor's graph
    untraceable: dict[str, str] = field(default_factory=dict)
    rounds: int = ROUNDS  # each time above is the median of this many rounds timed in turns
    spread_ms: float = 0.0  # the widest range of one model's rounds behind those times
    floor_ms: float = 0.0  # the model's sites' roofline floors summed; 0: not known

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


def predicted_speedup(total_ms: float, gains: list[SiteGain]) -> float:
    """Amdahl: the model's time with each site's time divided by its speedup."""
    saved = sum(g.saved_ms for g in gains)
    return total_ms / max(total_ms - saved, 1e-9) if total_ms > 0 else 1.0


def fresh_like(inputs: tuple, seed: int) -> tuple:
    """Inputs of the same shapes, dtypes and value ranges as `inputs`, drawn anew on each
    one's device (inputs can be gigabytes: drawn where they live, their statistics taken in
    chunks, `core.runtime.site_problem.moments`)."""
    generators: dict[torch.device, torch.Generator] = {}

    def generator(device: torch.device) -> torch.Generator:
        if device not in generators:
            generators[device] = torch.Generator(device=device).manual_seed(seed)
        return generators[device]

    def draw(x: object) -> object:
        if not isinstance(x, torch.Tensor) or x.numel() == 0:
            return x
        if x.is_floating_point():
            mean, std, _, _ = moments(x.detach().reshape(-1))
            fresh = torch.randn(x.shape, generator=generator(x.device), device=x.device)
            return fresh.mul_(std or 1.0).add_(mean).to(x.dtype)
        if x.dtype == torch.bool:
            return x.clone()
        low, high = int(x.min()), int(x.max())
        return torch.randint(low, high + 1, x.shape, generator=generator(x.device),
                             device=x.device).to(x.dtype)

    return tree_map(draw, inputs)


def check_outputs(model: nn.Module, installed: Callable, inputs: tuple, tf32: bool,
                  device: str) -> Deviation:
    """`installed` against eager `model` on each fresh seed's inputs."""
    worst_abs = worst_rel = 0.0
    mismatch = ""
    for seed in FRESH_SEEDS:
        fresh = fresh_like(inputs, seed)
        with torch.no_grad():
            reference = model(*fresh)
            out = installed(*fresh)
        tolerances = dtype_tolerances(reference, tf32, device)
        comparison = compare_outputs(out, reference, tolerances)
        if (comparison.mismatch is not None and comparison.mismatch.code is Reason.WRONG_VALUES
                and no_room_for_exact(model, fresh, reference, torch.device(device)) is None):
            # Outputs that are rounding noise: as close to the fp64 answer as eager's is? (A
            # model that cannot run in fp64 here, or whose fp64 answer would not fit beside
            # what other runs hold, keeps the mismatch.)
            with contextlib.suppress(torch.OutOfMemoryError, RuntimeError):
                exact = exact_answer(model, fresh)
                # Half precision keeps its own rule here: torch.compile's distance from eager.
                comparison = as_close_as_pytorch(out, reference, exact, tolerances,
                                                 FULL_PRECISION) or comparison
        worst_abs = max(worst_abs, comparison.max_abs_err)
        worst_rel = max(worst_rel, comparison.max_rel_err)
        if comparison.mismatch is not None and not mismatch:
            mismatch = f"fresh inputs (seed {seed}): {comparison.mismatch.message}"
        del fresh, reference, out  # before the next seed's: one set held at a time
    return Deviation(mismatch, worst_abs, worst_rel)


def why_wrong(deviation: Deviation, compiled: Deviation) -> str:
    """Why a model that deviates from eager this much is wrong; '' when it is right: within the
    evaluator's tolerance, or no further from eager than torch.compile itself lands (as much
    as `COMPILE_NOISE_FACTOR` times its worst element) where compile is outside it too."""
    if not deviation.mismatch:
        return ""
    if not compiled.mismatch:
        return deviation.mismatch
    if deviation.max_rel_err <= COMPILE_NOISE_FACTOR * compiled.max_rel_err:
        return ""
    return (f"{deviation.mismatch}; torch.compile's own worst element is "
            f"{compiled.max_rel_err:.3g}, and up to {COMPILE_NOISE_FACTOR}x that is allowed")


def correctness_text(e2e: dict[str, object], wrong: str = "wrong") -> str:
    """The check's outcome for the reports: `correct`, or `wrong` and why, with the worst
    errors (runs stored before torch.compile's own error was kept show the model's alone)."""
    verdict = "correct" if e2e["correct"] else f"{wrong}: {e2e['reason']}"
    errors = f"max relative error {e2e['max_rel_err']:.2g}"
    if e2e.get("compile_max_rel_err") is not None:
        errors += f"; torch.compile's own {e2e['compile_max_rel_err']:.2g}"
    return f"{verdict} on fresh inputs ({errors})"


def rounds_text(e2e: dict[str, object]) -> str:
    """How the times were taken, for the reports ('' for runs stored before it was kept)."""
    if "spread_ms" not in e2e:
        return ""
    return (f"; each time the median of {e2e['rounds']} rounds timed in turns, whose range "
            f"was at most {e2e['spread_ms']:.4f} ms")


def floor_text(e2e: dict[str, object]) -> str:
    """The model's floor beside its times on a GPU, and how near the model runs to it ('' on the
    CPU, whose times say nothing of a GPU's, and for runs stored before it was kept)."""
    floor = float(e2e.get("floor_ms") or 0.0)
    if e2e["timing"] == "cpu" or floor <= 0:
        return ""
    return (f"; the model's floor {floor:.4f} ms (its sites' roofline floors summed): it runs at "
            f"{floor / float(e2e['optimized_ms']):.0%} of the floor")


class EndToEndCheck:
    """Installs the winners in `model`, checks the result and times it against eager and
    torch.compile."""

    def __init__(self, model: nn.Module, inputs: tuple, device: str, tf32: bool,
                 progress: Progress, eval_config: EvalConfig | None = None,
                 rest: str | None = None, drop_slower: bool = True) -> None:
        """`rest` forces what runs the ops without a kernel ("inductor" or "eager"); by
        default, whichever of torch.compile and eager timed faster. `drop_slower=False` keeps
        kernels that slow the whole model (to study them; an optimize run never does).
        `tf32`: the model's fp32 products run as TF32 (its convolutions, or its matmuls in a run
        that allows TF32), so its fp32 outputs are held to TF32's tolerance."""
        self.model, self.inputs, self.device = model, inputs, device
        self.rest, self.drop_slower = rest, drop_slower
        self.tf32 = tf32
        self.progress = progress
        self.config = eval_config or EvalConfig(device=device)
        # The sets a timing rotates through, as many as cover the L2 within the evaluator's
        # rotation budget: inputs as large as the L2 are timed on themselves, not on copies.
        sets = min(len(FRESH_SEEDS), rotation_copies(list(inputs), torch.device(device),
                                                     self.config.rotation_budget_bytes))
        self.input_sets = ([list(inputs)] if sets == 1 else
                           [list(fresh_like(inputs, seed)) for seed in FRESH_SEEDS[:sets]])

    def time(self, run: Callable) -> float:
        """One round's median of `run`, by the evaluator's timing rules."""
        config = self.config
        with exclusive_device(config.gpu_lock or device_lock_path(self.device)):
            stats = time_model(run, self.input_sets, torch.device(self.device),
                               config.warmup_count, config.trial_count, config.warmup_time_ms)
        return stats.median_ms

    def compare(self, with_it: Callable, without_it: Callable) -> Comparison:
        """Both models timed in turns, the first of each round alternating."""
        rounds: dict[int, list[float]] = {0: [], 1: []}
        for i in range(ROUNDS):
            for arm in (0, 1) if i % 2 == 0 else (1, 0):
                rounds[arm].append(self.time((with_it, without_it)[arm]))
        return Comparison.of(rounds[0], rounds[1])

    def _install(self, gains: list[SiteGain], rest: str) -> InstalledModel:
        installed = install(self.model, [g.kernel for g in gains], rest=rest)
        if gains:  # with none it is the baseline, neither timed nor checked again
            with torch.no_grad():
                installed(*self.input_sets[0])  # compiled here, not inside the timing
        return installed

    def _deviation(self, model: Callable) -> Deviation:
        return check_outputs(self.model, model, self.inputs, self.tf32, self.device)

    def _wrong(self, installed: Callable, compiled: Deviation) -> str:
        return why_wrong(self._deviation(installed), compiled)

    def _correct(self, gains: list[SiteGain], rest: str, compiled: Deviation,
                 removed: dict[str, str]) -> list[SiteGain]:
        """The kernels the whole model agrees with. Each passed on its site alone; only when
        the model is wrong with all of them is each tried on its own."""
        if not gains or not self._wrong(self._install(gains, rest), compiled):
            return gains
        right = []
        for gain in gains:
            wrong = self._wrong(self._install([gain], rest), compiled)
            if wrong:
                removed[gain.kernel.key] = f"the model was wrong with it: {wrong}"
            else:
                right.append(gain)
        return right

    def _paying(self, gains: list[SiteGain], rest: str, baseline: Callable,
                removed: dict[str, str]
                ) -> tuple[list[SiteGain], InstalledModel | None, float, float]:
        """Kernels added one at a time, the most promising first, each kept only if the model
        is faster with it than without it beyond the spread of the rounds: one kernel can win
        alone yet cost the model more than it saves (a fusion inductor would have made across
        its site's edge, or a boundary that costs more than its site saves: bench/NOTES.md,
        third round, suite). The kernels kept, the model with them, its time (None and the
        baseline's time when none is kept) and the rounds' spread behind that time."""
        if not self.drop_slower and gains:
            installed = self._install(gains, rest)
            comparison = self.compare(installed, baseline)
            return gains, installed, comparison.with_ms, comparison.spread_ms
        kept: list[SiteGain] = []
        installed, model_ms, spread_ms = None, 0.0, 0.0
        for gain in gains:
            with_it = self._install([*kept, gain], rest)
            comparison = self.compare(with_it, baseline if installed is None else installed)
            if comparison.pays:
                kept.append(gain)
                installed, model_ms, spread_ms = with_it, comparison.with_ms, comparison.spread_ms
            else:
                without = baseline if installed is None else installed
                removed[gain.kernel.key] = (f"{comparison.why_not()}; "
                                            f"{self._kernel_diff(with_it, without)}")
                self.progress.step(f"end to end: {gain.kernel.key} did not make the model "
                                   "faster; taken out")
        return kept, installed, model_ms, spread_ms

    def _kernel_diff(self, with_it: Callable, without: Callable) -> str:
        """The kernels one forward runs with a kernel that lost and without it: the cause."""
        try:
            return describe(kernel_times(with_it, self.input_sets[0], self.device),
                            kernel_times(without, self.input_sets[0], self.device))
        except RuntimeError as err:  # the removal stands; the report says why no profile
            return f"no kernel profile ({error_line(err)})"

    def run(self, total_ms: float, gains: list[SiteGain]) -> EndToEnd:
        with steady_threads(torch.device(self.device)):
            return self._run(total_ms, gains)

    def _run(self, total_ms: float, gains: list[SiteGain]) -> EndToEnd:
        self.progress.step("end to end: timing eager and torch.compile in turns")
        set_tracing_rules()
        compiled = torch.compile(self.model)
        with torch.no_grad():
            compiled(*self.input_sets[0])
        times = self.compare(self.model, compiled)
        eager_ms, compile_ms = times.with_ms, times.without_ms
        compiled_deviation = self._deviation(compiled)
        rest = self.rest or ("inductor" if compile_ms <= eager_ms else "eager")
        baseline = {"eager": self.model, "inductor": compiled}[rest]
        removed: dict[str, str] = {}
        ranked = sorted(gains, key=lambda g: -g.saved_ms)
        self.progress.step(f"end to end: {len(ranked)} kernel(s) to try, the rest to {rest}")
        right = self._correct(ranked, rest, compiled_deviation, removed)
        kept, installed, optimized_ms, kept_spread_ms = self._paying(right, rest, baseline,
                                                                     removed)
        deviation = compiled_deviation if rest == "inductor" else Deviation("", 0.0, 0.0)
        ran: list[str] = []
        calls: dict[str, int] = {}
        untraceable: dict[str, str] = {}
        if installed is not None:
            deviation = self._deviation(installed)
            failures = installed.failures()
            for key, why in failures.items():
                removed[key] = f"failed at run time and fell back to PyTorch: {why}"
            ran = sorted({call.split(": ")[0] for call in installed.calls
                          if call.endswith(": kernel")} - set(failures))
            calls = installed.stats()
            untraceable = {k: v for k, v in installed.untraceable.items() if k in ran}
        # With no kernel of Kiln's the model is its own baseline, 1.00x by definition: timing
        # it once more would only turn noise into a figure.
        if not ran:
            optimized_ms = {"eager": eager_ms, "inductor": compile_ms}[rest]
        reason = why_wrong(deviation, compiled_deviation)
        return EndToEnd(
            correct=not reason, reason=reason, max_abs_err=deviation.max_abs_err,
            max_rel_err=deviation.max_rel_err,
            eager_ms=eager_ms, optimized_ms=optimized_ms, compile_ms=compile_ms,
            speedup_vs_eager=eager_ms / optimized_ms if ran else 1.0,
            speedup_vs_compile=compile_ms / optimized_ms if ran else 1.0,
            predicted_speedup=predicted_speedup(total_ms,
                                                [g for g in kept if g.kernel.key in ran]),
            compile_max_rel_err=compiled_deviation.max_rel_err, rest=rest,
            timing="gpu" if self.device == "cuda" else "cpu",
            installed=ran, removed=removed, calls=calls, untraceable=untraceable,
            spread_ms=max(times.spread_ms, kept_spread_ms if ran else 0.0))
