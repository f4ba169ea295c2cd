"""A judge keeps none of a candidate's inputs once its process has ended: the process lets go of
every buffer the judge handed in before it ends (CUDA IPC keeps a buffer allocated in the judge
for as long as the judge lives when its receiver ends holding it), and a judge whose candidate
ended holding some (a hung candidate, killed) is not fit to judge the next one. Needs a GPU."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.test_evaluate_memory import CANDIDATE, write_problem

ROOT = Path(__file__).resolve().parent.parent

# A judge in a fresh process, as a worker runs one (a process that has started CUDA cannot fork
# the zygote); after each verdict it frees what a worker frees, then reports what it still has
# allocated, and whether it is fit to go on.
JUDGE_MANY = """
import json, shutil, sys, tempfile
from pathlib import Path

import torch

from core.evaluate.config import EvalConfig
from core.evaluate.evaluator import screen
from core.evaluate.judge import Judge
from core.evaluate.sandbox import require_sandbox
from core.evaluate.worker import prepare_judging

require_sandbox()
prepare_judging("cuda")
problem, sources = Path(sys.argv[1]), json.loads(Path(sys.argv[2]).read_text())
workdir = Path(tempfile.mkdtemp())
judge = Judge.start(workdir, "cuda")
config = EvalConfig(device="cuda", run_timeout_s=20.0)
outcomes = []
for source in sources:
    request = screen(problem, source, config)
    verdict, healthy = judge.judge(request.problem_path, request.candidate_source, config,
                                   set(request.anchors), lambda phase: None)
    torch.cuda.ipc_collect()
    torch.cuda.empty_cache()
    outcomes.append({"reason": verdict.reason_code.value if verdict.reason_code else "accepted",
                     "healthy": healthy, "allocated": torch.cuda.memory_allocated()})
judge.zygote.close()
shutil.rmtree(workdir, ignore_errors=True)
print(json.dumps(outcomes))
"""

GOOD = CANDIDATE.replace("BLOCK = 1 << 20", "BLOCK = 1024")
HANGS = GOOD.replace("        return out\n", "        while True:\n            pass\n")


@pytest.mark.gpu
def test_the_judge_keeps_no_candidates_inputs_and_a_hung_ones_retires_it(tmp_path):
    n = 64 << 20  # 256 MB an input
    problem = write_problem(tmp_path, "large", n)
    sources = tmp_path / "sources.json"
    sources.write_text(json.dumps([GOOD] * 3 + [HANGS]))
    result = subprocess.run([sys.executable, "-c", JUDGE_MANY, str(problem), str(sources)],
                            capture_output=True, text=True, cwd=ROOT, timeout=600,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert result.returncode == 0, result.stderr[-3000:]
    outcomes = json.loads(result.stdout.splitlines()[-1])
    good, hung = outcomes[:3], outcomes[3]
    assert all(o["healthy"] for o in good), outcomes
    # What stays allocated is the judge's own (the reference model, the guard's pattern), the
    # same after every candidate: none of the 256 MB inputs a candidate held.
    assert good[-1]["allocated"] <= good[0]["allocated"] + (32 << 20), outcomes
    assert good[0]["allocated"] < n * 4, outcomes
    assert hung["reason"] == "timeout" and not hung["healthy"], outcomes
