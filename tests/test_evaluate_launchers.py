"""Triton's launchers built once by the judge and read by candidates' processes: only checked
signatures are built, Triton's own cache finds them, and a candidate's process records those it
had to build itself. The builds are real (the C compiler, against a stand-in libcuda, since this
machine has no driver); on a GPU a second candidate builds none."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from core.evaluate.launchers import (
    LAUNCHER,
    MAX_ARGUMENTS,
    LauncherFolder,
    checked_signature,
    suffix,
)

ROOT = Path(__file__).resolve().parent.parent
POINTWISE = ["*fp32", "*fp32", "i32", "constexpr"]
DRIVER_FUNCTIONS = ["cuCtxGetCurrent", "cuCtxSetCurrent", "cuDeviceGet",
                    "cuDevicePrimaryCtxRetain", "cuFuncSetAttribute", "cuGetErrorString",
                    "cuPointerGetAttribute"]
needs_cc = pytest.mark.skipif(shutil.which("gcc") is None and shutil.which("clang") is None,
                              reason="no C compiler")


@pytest.fixture
def stand_in_libcuda(tmp_path, monkeypatch):
    """A libcuda.so.1 whose functions (those Triton 3.6's launchers call) do nothing, to link
    and load launchers on a machine without the driver."""
    folder = tmp_path / "libcuda"
    folder.mkdir()
    (folder / "empty.c").write_text("".join(f"int {name}(void) {{ return 1; }}\n"
                                            for name in DRIVER_FUNCTIONS))
    subprocess.run([shutil.which("gcc") or "clang", "-shared", "-fPIC",
                    "-Wl,-soname,libcuda.so.1", "-o", str(folder / "libcuda.so.1"),
                    str(folder / "empty.c")], check=True)
    monkeypatch.setenv("TRITON_LIBCUDA_PATH", str(folder))
    from triton.backends.nvidia import driver

    driver.libcuda_dirs.cache_clear()
    driver.library_dirs.cache_clear()
    yield folder
    driver.libcuda_dirs.cache_clear()
    driver.library_dirs.cache_clear()


@pytest.mark.parametrize("signature", [POINTWISE, ["*bf16", "*kfp16", "fp32", "i64", "u8"],
                                       ["*i1", "*fp8e4nv", "i1"]])
def test_triton_type_names_are_accepted(signature):
    assert checked_signature(signature) == tuple(signature)


@pytest.mark.parametrize("value", [
    "*fp32", [], ["*fp32", ("*fp32", "i32")], ["*fp32", "i32); system(\"id\"); (void"],
    ["tensordesc<fp32[64, 64]>"], ["*fp32"] * (MAX_ARGUMENTS + 1), [1, 2], None,
], ids=["a string", "empty", "a tuple", "C source", "a tensor descriptor", "too many",
        "numbers", "nothing"])
def test_anything_else_is_refused(value):
    assert checked_signature(value) is None


@needs_cc
def test_a_built_launcher_is_where_tritons_cache_looks(tmp_path, stand_in_libcuda):
    folder = LauncherFolder(tmp_path / "launchers")
    assert folder.build([POINTWISE, POINTWISE, ["not a type"]]) == [tuple(POINTWISE)]
    path = folder.path_of(tuple(POINTWISE))
    assert path.is_file() and path.name == f"{LAUNCHER}{suffix()}"
    assert folder.build([POINTWISE]) == []  # built once
    # In a fresh process, as a candidate's: Triton's own compile_module_from_src, with a
    # compiler that fails if called, finds the judge's launcher through the shared cache.
    script = textwrap.dedent(f"""
        import ctypes, os, sys
        from pathlib import Path
        ctypes.CDLL({str(stand_in_libcuda / "libcuda.so.1")!r}, mode=ctypes.RTLD_GLOBAL)
        import triton
        from triton.backends.nvidia import driver
        from triton.runtime.build import compile_module_from_src
        from core.evaluate.launchers import use_shared_launchers

        def no_compiler(*args):
            raise SystemExit("the launcher was built again")

        triton.knobs.build.impl = no_compiler
        triton.knobs.cache.dir = {str(tmp_path / "own-cache")!r}
        missing = use_shared_launchers(Path({str(folder.folder)!r}))
        source = driver.make_launcher({{}}, dict(enumerate({POINTWISE!r})), None)
        module = compile_module_from_src(source, "{LAUNCHER}", driver.library_dirs(),
                                         driver.include_dirs, driver.libraries)
        print(module.__file__)
        print(missing)
        driver.make_launcher({{}}, dict(enumerate(["*fp16", "i32"])), None)
        print(missing)
    """)
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                            cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=120)
    assert result.returncode == 0, result.stderr
    module_file, before, after = result.stdout.splitlines()
    assert Path(module_file) == path
    assert before == "[]"
    assert after == "[['*fp16', 'i32']]"


@needs_cc
def test_a_failed_build_is_said_and_not_tried_again(tmp_path, stand_in_libcuda, monkeypatch,
                                                    capsys):
    monkeypatch.setenv("CC", str(tmp_path / "no-such-compiler"))
    folder = LauncherFolder(tmp_path / "launchers")
    assert folder.build([POINTWISE]) == []
    assert "could not build Triton's launcher" in capsys.readouterr().err
    assert tuple(POINTWISE) in folder.failed
    monkeypatch.delenv("CC")
    assert folder.build([POINTWISE]) == []  # not tried again
    assert not folder.path_of(tuple(POINTWISE)).exists()


def test_the_runner_reports_the_very_record_the_launch_hook_fills():
    """An empty record is still the one `use_shared_launchers` fills as kernels launch."""
    import torch

    from core.evaluate.runner import Runner

    missing: list[list[str]] = []
    runner = Runner(None, torch.device("cpu"), missing)  # type: ignore[arg-type]
    missing.append(POINTWISE)
    assert runner.handle({"op": "stats"}, [])[0]["launchers"] == [POINTWISE]


# A judge in a fresh process, as a worker runs one (a process that has started CUDA cannot fork
# the zygote), judging one candidate twice; it prints what each candidate's process reported.
JUDGE_TWICE = """
import json, shutil, sys, tempfile
from pathlib import Path
from core.evaluate.config import EvalConfig
from core.evaluate.evaluator import screen
from core.evaluate.judge import Judge
from core.evaluate.launchers import LauncherFolder
from core.evaluate.sandbox import require_sandbox
from core.evaluate.worker import prepare_judging

require_sandbox()
prepare_judging("cuda")
data = Path(sys.argv[1])
workdir = Path(tempfile.mkdtemp())
judge = Judge.start(workdir, "cuda")
reports = []
build = LauncherFolder.build
judge.launchers.build = lambda requested: reports.append(requested) or build(judge.launchers,
                                                                             requested)
verdicts = []
config = EvalConfig(device="cuda")
for _ in range(2):
    request = screen(data / "pointwise_problem.py", (data / "good_pointwise.py").read_text(),
                     config)
    verdict, _ = judge.judge(request.problem_path, request.candidate_source, config,
                             set(request.anchors), lambda phase: None)
    verdicts.append(verdict.reason if not verdict.correct else "correct")
judge.zygote.close()
built = sorted(p.name for p in judge.launchers.folder.glob("*/*"))
shutil.rmtree(workdir, ignore_errors=True)
print(json.dumps({"verdicts": verdicts, "reports": reports, "built": built}))
"""


@pytest.mark.gpu
def test_a_second_candidate_builds_no_launcher():
    result = subprocess.run([sys.executable, "-c", JUDGE_TWICE,
                             str(ROOT / "tests" / "data" / "evaluate")],
                            capture_output=True, text=True, cwd=ROOT, timeout=300,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert result.returncode == 0, result.stderr[-3000:]
    outcome = json.loads(result.stdout.splitlines()[-1])
    assert outcome["verdicts"] == ["correct", "correct"], outcome
    # Only the first candidate's process had to build a launcher (the judge hears of none
    # from the second).
    assert len(outcome["reports"]) == 1 and outcome["reports"][0], outcome
    assert outcome["built"] == [f"{LAUNCHER}{suffix()}"], outcome
