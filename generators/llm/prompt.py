"""What the model is told and what is taken from its reply.

Prompts are the text files in `generators/prompts/` with `${placeholders}`: the rules (system),
then a draft, a repair of a failed kernel, a refinement of a correct one, or a translation of
the best Triton kernel into CUDA. A reply's first fenced code block is the candidate; it is
screened with the evaluator's static rules before anything imports it.
"""

from __future__ import annotations

import ast
import inspect
import re
from dataclasses import dataclass
from pathlib import Path
from string import Template

import torch

from core.evaluate.static_rules import check_candidate, problem_anchors
from core.profile.load import import_file
from core.profile.roofline import GpuPeaks
from core.runtime.problem_loader import defined_names
from core.runtime.python_ast import parse
from generators.base import Feedback

PROMPTS = Path(__file__).parent / "prompts"
TIER_NAMES = {"triton": "Triton (tier `triton`)", "cuda": "CUDA C++ through pycuda (tier `cuda`)"}
TARGETS = {
    "triton": "Tier `triton`: write the region as one or a few `@triton.jit` kernels.",
    "cuda": "Tier `cuda`: write the region as CUDA C++ `__global__` kernels loaded with "
            "`core.runtime.cuda.load_kernel`; no Triton.",
}
FENCE = re.compile(r"```[ \t]*([\w+.-]*)[^\n]*\n(.*?)^[ \t]*```", re.DOTALL | re.MULTILINE)
LOG_LIMIT = 4000  # characters of a compiler log: the first errors are the useful ones


def template(name: str) -> Template:
    return Template((PROMPTS / f"{name}.md").read_text())


def gpu_facts(peaks: GpuPeaks) -> str:
    """Name, SMs, L2, memory bandwidth and peak rates of the GPU the kernels will run on."""
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(torch.cuda.current_device())
        name, sms, l2 = props.name, props.multi_processor_count, props.L2_cache_size
        memory = f"{props.total_memory / 2**30:.0f} GiB, compute capability " \
                 f"{props.major}.{props.minor}"
    else:
        name, sms, l2 = f"NVIDIA {peaks.name}", peaks.sms, peaks.l2_bytes
        memory = "141 GB HBM3e, compute capability 9.0"
    names = {"fp32": "fp32 as three tf32 products"}
    matrix = ", ".join(f"{names.get(dtype, dtype)} {flops / 1e12:.0f}" for dtype, flops in
                       peaks.matrix_flops.items())
    return (f"- {name}: {sms} SMs, {l2 / 2**20:.0f} MiB L2, {memory}\n"
            f"- memory bandwidth {peaks.bandwidth / 1e12:.1f} TB/s (measured copy, read + write)\n"
            f"- matrix peaks (TFLOP/s): {matrix}; fp32 vector {peaks.vector_flops / 1e12:.0f}")


def describe_inputs(problem: Path) -> str:
    """Each forward argument's shape, dtype and layout, from the problem's own `get_inputs()`,
    drawn on meta tensors (a problem's inputs can be gigabytes)."""
    module = import_file(problem, f"kiln_llm_{problem.parent.name.replace('-', '_')}")
    names = list(inspect.signature(module.Model.forward).parameters)[1:]
    with torch.random.fork_rng(), torch.device("meta"):
        torch.manual_seed(0)
        inputs = module.get_inputs()
    lines = []
    for index, value in enumerate(inputs):
        name = names[index] if index < len(names) else f"argument {index}"
        if isinstance(value, torch.Tensor):
            layout = "contiguous" if value.is_contiguous() else f"strides {tuple(value.stride())}"
            lines.append(f"- `{name}`: shape {tuple(value.shape)}, {value.dtype}, {layout}")
        else:
            lines.append(f"- `{name}`: {value!r}")
    return "\n".join(lines) or "- (no arguments)"


def describe_feedback(feedback: Feedback | None) -> str:
    """The evaluator's word on a kernel: verdict, errors with line numbers, timings, and what
    limits it when the evaluator could tell."""
    if feedback is None:
        return "Not measured yet."
    lines = [f"Verdict: {'correct' if feedback.correct else 'rejected'}"
             + (f": {feedback.reason}" if feedback.reason else "")]
    if feedback.latency_ms is not None:
        timing = f"Latency {feedback.latency_ms:.4f} ms"
        if feedback.baseline_ms:
            timing += (f"; baseline (faster of eager and torch.compile) "
                       f"{feedback.baseline_ms:.4f} ms, speedup {feedback.speedup:.2f}x")
        lines.append(timing)
    if feedback.floor_ms:
        where = ""
        if feedback.latency_ms:
            where = f": the kernel runs at {feedback.floor_ms / feedback.latency_ms:.0%} of it"
        lines.append(f"Roofline floor (bytes / bandwidth, FLOPs / peak) "
                     f"{feedback.floor_ms:.4f} ms{where}")
    if feedback.diagnosis:
        lines.append(f"Diagnosis (from the compiler's register, spill, shared-memory and load "
                     f"figures, the timing and, where read, Nsight Compute's hardware "
                     f"counters): {feedback.diagnosis}")
    if feedback.compile_log:
        log = feedback.compile_log[:LOG_LIMIT]
        lines.append(f"Compiler output:\n```\n{log}\n```")
    return "\n".join(lines)


def numbered(source: str) -> str:
    return "\n".join(f"{i:4d}  {line}" for i, line in enumerate(source.splitlines(), 1))


def first_code_block(reply: str) -> str | None:
    """The body of the reply's first complete fenced code block; None without one."""
    match = FENCE.search(reply)
    if match is None or not match[2].strip():
        return None
    return match[2].rstrip() + "\n"


def rationale_of(reply: str, fallback: str) -> str:
    """The first sentence the model wrote outside its code, on one line."""
    prose = FENCE.sub(" ", reply)
    words = " ".join(prose.split())
    sentence = re.split(r"(?<=[.!?])\s", words, maxsplit=1)[0] if words else ""
    return (sentence[:200] or fallback).strip()


@dataclass(frozen=True)
class Screened:
    source: str | None
    problems: list[str]  # empty: the source may go to the evaluator

    @property
    def ok(self) -> bool:
        return self.source is not None and not self.problems


def screen_reply(reply: str, problem_source: str) -> Screened:
    """The reply's candidate and what keeps it from being evaluated, by the evaluator's rules."""
    source = first_code_block(reply)
    if source is None:
        return Screened(None, ["the reply has no fenced code block (```python ... ```) holding "
                               "the module"])
    try:
        # TF32 as the evaluator allows it by default: on convolutions only.
        report = check_candidate(source, problem_source,
                                 tf32="conv" in problem_anchors(problem_source))
    except SyntaxError as err:
        return Screened(source, [f"line {err.lineno}: {err.msg} (the module does not parse)"])
    problems = list(report.violations)
    if "ModelNew" not in defined_names(source):
        classes = sorted(n.name for n in parse(source).body if isinstance(n, ast.ClassDef))
        named = f" (it defines {', '.join(classes)})" if classes else ""
        problems.insert(0, f"the module defines no class named ModelNew{named}")
    return Screened(source, problems)
