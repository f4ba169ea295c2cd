"""A judge keeps none of a candidate's inputs once its process has ended: the process lets go of
every buffer the judge handed in before it ends, and where it could not (a hung candidate,
killed; one that died), the judge gives back the references of the process that has exited (CUDA
IPC keeps a buffer allocated in the judge for as long as the judge lives when its receiver ends
holding it), and goes on judging. Needs a GPU."""

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
from core.evaluate.judge import Judge
from core.evaluate.sandbox import require_sandbox
from core.evaluate.worker import prepare_judging

require_sandbox()
prepare_judging("cuda")
problem, sources = Path(sys.argv[1]), json.loads(Path(sys.argv[2]).read_text())
workdir = Path(tempfile.mkdtemp())
judge = Judge.start(workdir, "cuda")
config = EvalConfig(device="cuda", run_timeout_s=20.0, compile_timeout_s=30.0)
outcomes = []
for source in sources:  # unscreened: the static rules would refuse the one calling os._exit
    verdict, healthy = judge.judge(str(problem), source, config, set(), lambda phase: None)
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
DIES = GOOD.replace("        return out\n", "        import os\n        os._exit(3)\n")


@pytest.mark.gpu
def test_the_judge_keeps_no_inputs_of_a_candidate_that_ended_or_was_killed(tmp_path):
    n = 64 << 20  # 256 MB an input
    problem = write_problem(tmp_path, "large", n)
    sources = tmp_path / "sources.json"
    sources.write_text(json.dumps([GOOD, GOOD, HANGS, DIES, GOOD]))
    result = subprocess.run([sys.executable, "-c", JUDGE_MANY, str(problem), str(sources)],
                            capture_output=True, text=True, cwd=ROOT, timeout=600,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert result.returncode == 0, result.stderr[-3000:]
    outcomes = json.loads(result.stdout.splitlines()[-1])
    hung, died = outcomes[2], outcomes[3]
    assert hung["reason"] == "timeout" and died["reason"] == "crash", outcomes
    assert all(o["healthy"] for o in outcomes), outcomes
    # What stays allocated is the judge's own (the reference model, the guard's pattern), the
    # same after every candidate: none of the 256 MB inputs a candidate held, even the two
    # that ended holding theirs.
    assert all(o["allocated"] <= outcomes[0]["allocated"] + (32 << 20) for o in outcomes), outcomes
    assert outcomes[0]["allocated"] < n * 4, outcomes
