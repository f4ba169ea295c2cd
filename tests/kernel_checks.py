"""Comparing a generated kernel's output with PyTorch's, with a message that shows where; running
a candidate source beside its problem's Model; judging a draft through the evaluator; the
one-line site problems the kernel tests write; and compiling kernels for sm_90 with no GPU."""

from __future__ import annotations

import inspect
import json
import os
import subprocess
import sys
from pathlib import Path

import torch
import triton.language as tl

from core.evaluate import EvalConfig, Verdict, evaluate
from generators.base import Proposal
from generators.rules import RulesGenerator

ROOT = Path(__file__).resolve().parent.parent

# Relative to the reference's largest magnitude. bf16 keeps 8 bits of mantissa, and a chain
# rounded once in fp32 differs from PyTorch's per-op rounding by up to a couple of its ulps.
TOLERANCE = {torch.float32: 1e-5, torch.float16: 1e-2, torch.bfloat16: 2e-2}


def assert_matches(actual: torch.Tensor, expected: torch.Tensor, context: str = "") -> None:
    assert actual.dtype == expected.dtype and actual.shape == expected.shape, (
        f"got {actual.dtype} {tuple(actual.shape)}, expected {expected.dtype} "
        f"{tuple(expected.shape)}")
    scale = expected.double().abs().max().item() + 1e-6
    error = (actual.double() - expected.double()).abs()
    worst = error.max().item() / scale
    where = tuple(int(i) for i in torch.nonzero(error == error.max())[0])
    assert worst <= TOLERANCE[expected.dtype], (
        f"relative error {worst:.3g} at {where}: {actual[where].item()} vs "
        f"{expected[where].item()}\n{context}")


def run_beside_problem(source: str, problem_path: Path, seed: int,
                       inputs: list | None = None) -> tuple[object, object]:
    """The candidate `source`'s ModelNew and the problem's Model on the same inputs (the
    problem's, drawn after `seed`, unless given): (actual, expected)."""
    from tests.test_site_problems import import_problem

    namespace: dict = {}
    exec(compile(source, "model_new.py", "exec"), namespace)
    problem = import_problem(problem_path)
    torch.manual_seed(seed)
    inputs = inputs or problem.get_inputs()
    with torch.no_grad():
        expected = problem.Model()(*inputs)
        return namespace["ModelNew"]()(*inputs), expected


def judged(path: Path, source: str, device: str = "cpu", launches: int | None = None
           ) -> Verdict:
    """The evaluator's verdict on `source` for the site problem at `path`, asserted correct
    (and, given `launches`, launching that many kernels, with no library op); timed on CUDA."""
    verdict = evaluate(path, source, EvalConfig(device=device, time=device == "cuda"))
    assert verdict.correct, verdict.reason
    if launches is not None:
        assert verdict.kernel_launches == launches and verdict.library_ops == [], (
            f"{verdict.kernel_launches} launches, library ops {verdict.library_ops}")
    return verdict


def first_draft(path: Path, n: int = 2) -> Proposal:
    """The rules generator's first draft for the site problem at `path`."""
    drafts = RulesGenerator().propose(path, None, n=n).children
    assert drafts, f"the rules generator drafts no kernel for {path.name}"
    return drafts[0]


def one_input_problem(folder: Path, body: str, inputs: str) -> Path:
    """`folder/problem.py`: a KernelBench problem whose Model returns `body` of its input `x`,
    drawn by the expression `inputs`."""
    path = folder / "problem.py"
    path.write_text("import torch\nimport torch.nn as nn\n\n\nclass Model(nn.Module):\n"
                    f"    def forward(self, x):\n        return {body}\n\n\n"
                    f"def get_inputs():\n    return [{inputs}]\n\n\n"
                    "def get_init_inputs():\n    return []\n")
    return path


# Compiles kernels of a module file for sm_90 with no GPU, in a process of its own: the Triton
# interpreter, which the tests run under, patches triton.language in the process that uses it.
_SM90_COMPILE = """
import importlib.util, json, sys, tempfile
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

spec = importlib.util.spec_from_file_location("kernels", sys.argv[1])
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
results = {}
for job in json.loads(sys.argv[2]):
    attrs = {(i,): [["tt.divisibility", 16]] for i in job["aligned"]}
    source = ASTSource(getattr(module, job["kernel"]), job["signature"],
                       constexprs=job["constexprs"], attrs=attrs)
    options = job.get("options") or {}
    with tempfile.TemporaryDirectory() as cache, triton.knobs.cache.scope():
        triton.knobs.cache.dir = cache
        try:
            compiled = triton.compile(source, target=GPUTarget("cuda", 90, 32), options=options)
            results[job["name"]] = {"name": compiled.name, "ptx": compiled.asm["ptx"]}
        except Exception as err:
            results[job["name"]] = {"error": f"{type(err).__name__}: {str(err)[-1500:]}"}
json.dump(results, sys.stdout)
"""


def compile_for_sm90(module_path: Path, jobs: list[dict]) -> dict[str, dict]:
    """Each job's kernel of `module_path` compiled for sm_90: its PTX and name, or the error.
    A job: name, kernel, signature (argument name to Triton type), constexprs, and the
    indices of the arguments to assume 16-byte aligned (as Triton specializes them)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    result = subprocess.run([sys.executable, "-c", _SM90_COMPILE, str(module_path),
                             json.dumps(jobs)], capture_output=True, text=True, env=env,
                            timeout=600, check=False)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout)


_TRITON_TYPES = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16",
                 torch.float64: "fp64", torch.int64: "i64", torch.int32: "i32",
                 torch.int16: "i16", torch.int8: "i8", torch.uint8: "u8", torch.bool: "i1"}
_LAUNCH_OPTIONS = ("num_warps", "num_stages", "num_ctas", "maxnreg")


def _is_constexpr(annotation: object) -> bool:
    return annotation is tl.constexpr or annotation in ("tl.constexpr", "constexpr")


def _launch_job(kernel: object, args: tuple, kwargs: dict) -> dict:
    """A compile job for one interpreted launch: the types, constants and 16-byte alignments
    Triton would specialize the kernel for on a GPU."""
    fn = kernel.fn  # type: ignore[attr-defined]
    options = {k: kwargs.pop(k) for k in _LAUNCH_OPTIONS if k in kwargs}
    params = list(inspect.signature(fn).parameters.values())
    given = {**dict(zip([p.name for p in params], args, strict=False)), **kwargs}
    signature: dict[str, str] = {}
    constexprs: dict[str, object] = {}
    aligned: list[int] = []
    for index, param in enumerate(params):
        value = given.get(param.name, param.default)
        if _is_constexpr(param.annotation) or value is None or (
                isinstance(value, int) and not isinstance(value, bool) and value == 1):
            signature[param.name], constexprs[param.name] = "constexpr", value
        elif isinstance(value, torch.Tensor):
            signature[param.name] = "*" + _TRITON_TYPES[value.dtype]
            if value.data_ptr() % 16 == 0:
                aligned.append(index)
        elif isinstance(value, bool):
            signature[param.name] = "i1"
        elif isinstance(value, int):
            signature[param.name] = "i32" if -2**31 <= value < 2**31 else "i64"
            if value % 16 == 0:
                aligned.append(index)
        else:
            signature[param.name] = "fp32"
    return {"name": f"{fn.__name__} #{id(kernel)}", "kernel": fn.__name__,
            "signature": signature, "constexprs": constexprs, "aligned": aligned,
            "options": options}


def launched_kernels(source: str, problem_path: Path, folder: Path) -> tuple[Path, list[dict]]:
    """Run `source` beside its problem under the Triton interpreter, and return the module file
    written for it with a compile job (`compile_for_sm90`) for every distinct launch."""
    from triton.runtime.interpreter import InterpretedFunction

    jobs: dict[str, dict] = {}
    original = InterpretedFunction.run

    def recording(self, *args, grid, warmup, **kwargs):  # noqa: ANN001, ANN202
        job = _launch_job(self, args, dict(kwargs))
        jobs.setdefault(json.dumps([job["kernel"], job["signature"], job["constexprs"],
                                    job["aligned"], job["options"]], default=str), job)
        return original(self, *args, grid=grid, warmup=warmup, **kwargs)

    InterpretedFunction.run = recording
    try:
        run_beside_problem(source, problem_path, 0)
    finally:
        InterpretedFunction.run = original
    module = folder / "model_new.py"
    module.write_text(source)
    return module, [{**job, "name": f"{job['kernel']} {i}"} for i, job in enumerate(jobs.values())]
