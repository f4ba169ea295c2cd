"""Where a judged candidate's wall time goes: the worker's judge built in this process, with a
timer around each step of the judge (the candidate process's calls, the comparisons, the input
copies, the reference's timing) and of the candidate's process (its build, each call, the
guard's buffers, the inputs it maps and the outputs it hands back).

    python bench/judge_steps_bench.py [--device cpu|cuda] [--rounds 2] [--uncapped-rotation]
                                      [--model PATH [--drafts 2]] [--memory-trace]
                                      [--memory-peak]

Judges the honest candidates of tests/data/evaluate `--rounds` times, one after another (the
first round pays the first-time costs), and prints per candidate its wall time, its verdict's
phases and the judge's steps by time spent; each candidate's process prints its own steps to
stderr as it ends. `--model` judges instead the rules generator's first `--drafts` kernels for
the largest site of that model (a KernelBench file, at its own sizes): where the time of a
candidate goes at real sizes. `--uncapped-rotation` times with as many input sets as cover the
L2 twice (what the timing did before `model_timing.MAX_ROTATION_SETS`), to compare.
`--memory-trace` (CUDA) prints, as the judge's steps end, the device memory the judge holds
and its peak so far: where a verdict's peak memory is reached. `--memory-peak` records the
judge's allocations (torch.profiler) and prints, per candidate, the blocks its allocator held at
its peak, largest first, each with when and where it was allocated (`bench.memory_peak`; on the
CPU the candidates' shared input copies are mapped files, not allocations, and do not show).
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import functools
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(HERE))
DEVICES = ("cpu", "cuda")
if __name__ == "__main__":  # the interpreter is on before the steps below import triton
    _device = argparse.ArgumentParser(add_help=False)
    _device.add_argument("--device", choices=DEVICES, default="cuda")
    if _device.parse_known_args()[0].device == "cpu":
        os.environ["TRITON_INTERPRET"] = "1"

import core.evaluate.candidate as candidate  # noqa: E402
import core.evaluate.exchange as exchange  # noqa: E402
import core.evaluate.judge_timing as judge_timing  # noqa: E402
import core.evaluate.runner as runner  # noqa: E402
import core.evaluate.trial as trial  # noqa: E402
from bench.judging_rate_bench import DATA, HONEST  # noqa: E402
from bench.memory_peak import PeakRecorder  # noqa: E402
from core.evaluate.config import EvalConfig  # noqa: E402
from core.evaluate.evaluator import screen  # noqa: E402
from core.evaluate.verdict import Verdict  # noqa: E402
from core.timing import model_timing  # noqa: E402

JUDGE_STEPS = [(candidate.CandidateProcess, "__init__"), (candidate.CandidateProcess, "build"),
               (candidate.CandidateProcess, "call"), (candidate.CandidateProcess, "close"),
               (exchange.JudgeSide, "encode_inputs"), (trial, "run_trial"),
               (trial, "compare_outputs"), (judge_timing, "compare_outputs"),
               (trial, "changed_inputs"), (judge_timing, "changed_inputs"),
               (trial, "shared_copies"), (judge_timing, "shared_copies"),
               (trial, "second_opinion"), (judge_timing, "rotation_sets"),
               (judge_timing, "time_candidate"), (judge_timing, "time_model"),
               (exchange, "import_cuda"), (exchange, "export_cuda")]
CANDIDATE_STEPS = [(runner.Runner, "build"), (runner.Runner, "call"), (runner, "time_once"),
                   (runner.Guard, "prepare"), (exchange.CandidateSide, "load_input"),
                   (exchange.CandidateSide, "export_output"), (exchange, "import_cuda"),
                   (exchange, "export_cuda")]
# Seconds and calls per step, in whichever process runs it (the candidate's inherits the
# wrappers through the zygote's fork and keeps its own totals).
TOTALS: dict[str, list[float]] = collections.defaultdict(lambda: [0.0, 0])
# The judge's steps whose end prints the device memory held and the peak so far (`--memory-trace`),
# in the judge's process only (the candidates' processes inherit the wrappers).
TRACED: set[str] = set()
JUDGE_PID = os.getpid()


def _label(owner: Any, name: str) -> str:
    return f"{getattr(owner, '__name__', owner).rsplit('.', 1)[-1]}.{name}"


def time_step(owner: Any, name: str) -> None:
    original, label = getattr(owner, name), _label(owner, name)

    @functools.wraps(original)
    def timed(*args: Any, **kwargs: Any) -> Any:
        began = time.perf_counter()
        try:
            return original(*args, **kwargs)
        finally:
            TOTALS[label][0] += time.perf_counter() - began
            TOTALS[label][1] += 1
            if label in TRACED and os.getpid() == JUDGE_PID:
                print(f"      {label}: {_held_mb()}", flush=True)

    setattr(owner, name, timed)


def _held_mb() -> str:
    import torch

    return (f"holds {torch.cuda.memory_allocated() / 2**20:.0f} MiB, "
            f"peak {torch.cuda.max_memory_allocated() / 2**20:.0f} MiB")


def report(totals: dict[str, list[float]], labels: set[str], indent: str) -> str:
    rows = sorted(((k, v) for k, v in totals.items() if k in labels), key=lambda kv: -kv[1][0])
    return "\n".join(f"{indent}{k}: {v[0]:.3f} s in {int(v[1])} calls" for k, v in rows)


def wrap_serve(labels: set[str]) -> None:
    """The candidate's process writes its steps to stderr when the judge lets it go."""
    serve = runner.Runner.serve

    def serve_and_report(self: runner.Runner) -> None:
        TOTALS.clear()
        try:
            serve(self)
        finally:
            os.write(2, f"a candidate's process, its steps:\n"
                        f"{report(TOTALS, labels, '    ')}\n{memory_line(self.device)}\n".encode())

    runner.Runner.serve = serve_and_report


def memory_line(device: Any) -> str:
    """This process's peak and held device memory (CUDA), for the memory a candidate takes."""
    import torch

    if torch.device(device).type != "cuda":
        return "    (no device memory on the CPU)"
    return (f"    device memory: peak {torch.cuda.max_memory_allocated() / 1e9:.2f} GB allocated, "
            f"{torch.cuda.memory_reserved() / 1e9:.2f} GB reserved now")


def largest_site_drafts(model: Path, device: str, drafts: int, folder: Path
                        ) -> list[tuple[str, Path, str]]:
    """The rules generator's first `drafts` kernels for the largest site of `model`."""
    from core.profile.pipeline import ListSitesConfig, list_sites
    from generators.rules import RulesGenerator

    report = list_sites(ListSitesConfig(model=str(model), device=device, out=folder / "sites",
                                        quiet=True))
    searchable = [s for s in report["sites"] if s.get("problem")]
    if not searchable:
        raise SystemExit(f"{model} has no site to judge kernels for")
    site = max(searchable, key=lambda s: s["time_ms"])
    path = Path(site["problem"])
    proposals = RulesGenerator().propose(path, None, drafts).children
    print(f"{model.stem}: site {site['id']} ({site['signature']}), {site['time_ms']:.3f} ms, "
          f"{site['bytes'] / 1e9:.2f} GB; {len(proposals)} drafts", flush=True)
    return [(f"{site['id']} draft {i}", path, p.source) for i, p in enumerate(proposals)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=DEVICES, default="cuda")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--uncapped-rotation", action="store_true",
                        help="rotate through as many input sets as cover the L2 twice")
    parser.add_argument("--model", type=Path, help="judge drafts for this model's largest site")
    parser.add_argument("--drafts", type=int, default=2)
    parser.add_argument("--memory-trace", action="store_true",
                        help="print the judge's device memory as each of its steps ends (CUDA)")
    parser.add_argument("--memory-peak", action="store_true",
                        help="print the blocks the judge held at its peak, and where each was "
                             "allocated")
    args = parser.parse_args()
    if args.memory_trace and args.device == "cuda":
        TRACED.update(_label(o, n) for o, n in JUDGE_STEPS)
    if args.uncapped_rotation:
        model_timing.MAX_ROTATION_SETS = 1 << 30
    for owner, name in dict.fromkeys(JUDGE_STEPS + CANDIDATE_STEPS):
        time_step(owner, name)
    wrap_serve({_label(o, n) for o, n in CANDIDATE_STEPS})

    import torch

    from core.evaluate.judge import Judge
    from core.evaluate.sandbox import require_sandbox
    from core.evaluate.worker import prepare_judging

    require_sandbox()
    prepare_judging(args.device)
    folder = Path(tempfile.mkdtemp())
    began = time.perf_counter()
    judge = Judge.start(folder, args.device)  # as a worker starts it, launcher folder and all
    print(f"zygote ready in {time.perf_counter() - began:.2f} s", flush=True)
    judge_labels = {_label(o, n) for o, n in JUDGE_STEPS}
    candidates = (largest_site_drafts(args.model, args.device, args.drafts, folder)
                  if args.model else
                  [(name, DATA / f"{problem}.py", (DATA / f"{name}.py").read_text())
                   for name, problem in HONEST.items()])
    try:
        for round_ in range(args.rounds):
            for name, problem_path, source in candidates:
                config = EvalConfig(device=args.device)
                request = screen(problem_path, source, config)
                if isinstance(request, Verdict):
                    raise SystemExit(f"{name} was settled by the static rules: {request.reason}")
                TOTALS.clear()
                began = time.perf_counter()
                with contextlib.ExitStack() as recording:
                    recorder = (recording.enter_context(PeakRecorder(args.device))
                                if args.memory_peak else None)
                    verdict, _ = judge.judge(request.problem_path, request.candidate_source,
                                             config, set(request.anchors), lambda phase: None)
                if recorder is not None:
                    print(recorder.peak().report(), flush=True)
                phases = ", ".join(f"{k} {v:.2f} s" for k, v in verdict.phase_seconds.items())
                print(f"round {round_}, {name}: {time.perf_counter() - began:.2f} s "
                      f"({phases}); {'correct' if verdict.correct else verdict.reason[:160]}")
                print(report(TOTALS, judge_labels, "    "), flush=True)
                peak = verdict.peak_memory_bytes
                print(f"    the judge's {memory_line(args.device).strip()}; the verdict's peak "
                      f"(judge and candidate): {(peak or 0) / 1e9:.2f} GB", flush=True)
                if args.device == "cuda":
                    torch.cuda.empty_cache()
    finally:
        judge.zygote.close()


if __name__ == "__main__":
    main()
