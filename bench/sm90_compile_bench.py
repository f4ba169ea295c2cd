"""Triton kernels compiled for sm_90 on a machine with no GPU: the launches of a candidate run
under the interpreter are recorded with the types, constants and 16-byte alignments a GPU would
specialize them for, and compiled by Triton's own compiler in a process of its own. The
interpreter runs what the compiler may refuse: a loop Triton's passes fail on, say.

    python -m bench.sm90_compile_bench [PROBLEM ...] [--drafts 3] [--out DIR]
    python -m bench.sm90_compile_bench --sites SITE_PROBLEM ... [--drafts 3]

compiles the first `--drafts` rules drafts of every site of each problem (default: every file of
bench/kernelbench_dev, each shrunk as `bench.compiler_coverage_bench --shrink` shrinks it) and
tables what failed. Shrunk sizes leave out what only large ones make (a row walked in a loop, not
in one block): `--sites` takes site problems as a run wrote them (`<out>/<model>/sites/*/
problem.py`), at their own sizes, and records their launches on meta tensors without running
them.
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

if __name__ == "__main__":  # launches are recorded under the interpreter, on before triton loads
    os.environ.setdefault("TRITON_INTERPRET", "1")
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
import triton.language as tl  # noqa: E402

from core.runtime.cuda import launch_error  # noqa: E402
from core.runtime.problem_loader import import_file, load_problem  # noqa: E402

# Compiled in a process of its own: the Triton interpreter patches triton.language in the
# process that uses it.
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
    if result.returncode != 0:
        raise RuntimeError(f"compiling {module_path} for sm_90 failed to run: "
                           f"{result.stderr[-3000:]}")
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
    return {"kernel": fn.__name__, "signature": signature, "constexprs": constexprs,
            "aligned": aligned, "options": options}


def launched_kernels(source: str, problem_path: Path, folder: Path, run: bool = True
                     ) -> tuple[Path, list[dict]]:
    """Run the candidate `source` on its problem's inputs under the Triton interpreter
    (TRITON_INTERPRET=1 in this process), and return the module file written for it with a
    compile job (`compile_for_sm90`) for every distinct launch. `run=False`: the forward runs on
    meta tensors and its launches are recorded without running, so that a problem of any size
    costs nothing (a forward that reads values, to size an output say, cannot be recorded so).
    A launch whose grid no GPU takes (`core.runtime.cuda.launch_error`) is an error."""
    from triton.runtime.interpreter import InterpretedFunction

    jobs: dict[str, dict] = {}
    refused: list[str] = []
    original = InterpretedFunction.run

    def recording(self, *args, grid, warmup, **kwargs):  # noqa: ANN001, ANN202
        job = _launch_job(self, args, dict(kwargs))
        jobs.setdefault(json.dumps(job, sort_keys=True, default=str), job)
        programs = tuple(grid(kwargs) if callable(grid) else grid)
        problem = launch_error((*programs, 1, 1)[:3], (1, 1, 1))
        if problem is not None:
            refused.append(f"{job['kernel']}: {problem}")
        if run:
            return original(self, *args, grid=grid, warmup=warmup, **kwargs)
        return None

    module = folder / "model_new.py"
    module.write_text(source)
    problem = load_problem(problem_path)
    candidate = import_file(module, f"kiln_sm90_{abs(hash(str(module)))}")
    InterpretedFunction.run = recording
    try:
        with torch.no_grad():
            torch.manual_seed(0)
            inputs = problem.inputs(0, "cpu" if run else "meta")
            candidate.ModelNew(*problem.init_inputs())(*inputs)
    finally:
        InterpretedFunction.run = original
    if refused:
        raise ValueError("no GPU launches " + "; ".join(dict.fromkeys(refused)))
    return module, [{**job, "name": f"{job['kernel']} {i}"} for i, job in enumerate(jobs.values())]


def main() -> int:
    from bench.compiler_coverage_bench import DEV, shrunk
    from core.profile.in_situ import ProfileConfig
    from core.profile.pipeline import ListSitesConfig, list_sites
    from generators.rules import RulesGenerator

    parser = argparse.ArgumentParser(prog="python -m bench.sm90_compile_bench",
                                     description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("problems", nargs="*", type=Path)
    parser.add_argument("--drafts", type=int, default=3)
    parser.add_argument("--out", type=Path, default=Path("kiln-out/sm90-compile"))
    parser.add_argument("--sites", nargs="*", type=Path, default=[],
                        help="site problems to compile the drafts of at their own sizes")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    generator = RulesGenerator()
    rows, kernels = [], 0

    def compile_drafts(name: str, path: Path, run: bool) -> None:
        nonlocal kernels
        for index, draft in enumerate(generator.propose(path, None, args.drafts).children):
            where = f"{name} | draft {index}"
            folder = Path(tempfile.mkdtemp(dir=args.out))
            try:
                module, jobs = launched_kernels(draft.source, path, folder, run)
            except Exception as err:  # noqa: BLE001 - a draft that fails to run is a row
                rows.append(f"| {where} | runs | {type(err).__name__}: {str(err)[:120]} |")
                continue
            for kernel, result in compile_for_sm90(module, jobs).items() if jobs else []:
                kernels += 1
                if "error" in result:
                    rows.append(f"| {where} | compiles {kernel} | "
                                f"{result['error'].splitlines()[-1][:160]} |")

    for site_problem in args.sites:
        compile_drafts(f"{site_problem.parent.parent.parent.name} | {site_problem.parent.name}",
                       site_problem, run=False)
        print(f"{site_problem}: {len(rows)} failure(s) so far, {kernels} kernels compiled",
              flush=True)
    for problem in [] if args.sites and not args.problems else (
            args.problems or sorted(DEV.glob("level*/*.py"))):
        small = args.out / "problems" / problem.parent.name / problem.name
        small.parent.mkdir(parents=True, exist_ok=True)
        small.write_text(shrunk(problem.read_text()))
        report = list_sites(ListSitesConfig(model=str(small), device="cpu",
                                            out=args.out / "sites" / problem.stem,
                                            profile=ProfileConfig(warmup=1, trials=1),
                                            quiet=True))
        for site in report["sites"]:
            compile_drafts(f"{problem.stem} | {site['id']}", Path(site["problem"]), run=True)
        print(f"{problem.stem}: {len(rows)} failure(s) so far, {kernels} kernels compiled",
              flush=True)
    text = "\n".join(["| problem, site, draft | step | error |", "| --- | --- | --- |", *rows,
                      "", f"{kernels} kernels compiled for sm_90; {len(rows)} failures."])
    (args.out / "sm90_compile.md").write_text(text + "\n")
    print(text)
    return 1 if rows else 0


if __name__ == "__main__":
    sys.exit(main())
