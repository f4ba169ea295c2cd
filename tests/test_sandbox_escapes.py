"""Candidates that got past the static rules (here handed to a real worker directly, unscreened)
still cannot touch the verdict, the judge, the network, the disk outside their scratch folder,
the environment's secrets, or outlive their evaluation; and nothing they patch reaches the next
candidate. Each payload is a real candidate file under tests/data/evaluate/escape_*.py."""

from __future__ import annotations

import socket
import time
import uuid
from pathlib import Path

import pytest

from core.evaluate.config import EvalConfig
from core.evaluate.static_rules import check_candidate
from core.evaluate.verdict import Reason, Verdict
from core.evaluate.worker import Request, Worker

DATA = Path(__file__).parent / "data" / "evaluate"
PROBLEM = DATA / "pointwise_problem.py"
ESCAPES = sorted(p.stem for p in DATA.glob("escape_*.py"))


@pytest.fixture(scope="module", params=["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def worker(request, tmp_path_factory):
    """A worker on the CPU (Triton's interpreter), and on a GPU, where the candidate's process
    starts CUDA before its walls go up."""
    with pytest.MonkeyPatch.context() as env:
        # Secrets of the optimizer's environment, which no judging process may inherit.
        env.setenv("OPENAI_API_KEY", "sk-not-for-candidates")
        env.setenv("KILN_TEST_SECRET_TOKEN", "token-not-for-candidates")
        env.setenv("AWS_SECRET_ACCESS_KEY", "aws-not-for-candidates")
        started = Worker(request.param, 120)
    yield started
    started.close()


def judge(worker: Worker, source: str, **settings: object) -> Verdict:
    config = EvalConfig(device=worker.device, time=False, **settings)
    request = Request(str(PROBLEM), source, config.to_dict(), "triton", [])
    return worker.evaluate(request, config.compile_timeout_s, config.run_timeout_s)


def escape(name: str, **replacements: str) -> str:
    source = (DATA / f"{name}.py").read_text()
    for old, new in replacements.items():
        assert old in source, old
        source = source.replace(old, new)
    return source


@pytest.mark.parametrize("name", ESCAPES)
def test_every_escape_is_refused_by_the_static_rules_first(name):
    report = check_candidate((DATA / f"{name}.py").read_text(), PROBLEM.read_text())
    assert not report.ok


def test_a_forged_verdict_on_every_descriptor_is_not_the_verdict(worker):
    """The worker's own pipe is not among them; what reaches the candidate's socket is a reply
    out of protocol, never a verdict."""
    verdict = judge(worker, escape("escape_forged_verdict"))
    assert not verdict.accepted and not verdict.correct
    assert verdict.reason_code in (Reason.CRASH, Reason.RUNTIME_ERROR), verdict.reason
    assert verdict.speedup is None
    assert worker.alive


def test_patches_of_the_judge_and_of_torch_reach_neither_the_verdict_nor_the_next_candidate(
        worker):
    patched = judge(worker, escape("escape_patch_judge"))
    assert patched.reason_code is Reason.WRONG_VALUES, patched.reason
    wrong = judge(worker, (DATA / "bad_small_error.py").read_text())
    assert wrong.reason_code is Reason.WRONG_VALUES, wrong.reason
    good = judge(worker, (DATA / "good_pointwise.py").read_text())
    assert good.correct, good.reason


def running_with(marker: str) -> list[int]:
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if marker.encode() in cmdline.read_bytes():
                found.append(int(cmdline.parent.name))
        except OSError:
            continue
    return found


def test_a_process_in_a_session_of_its_own_ends_with_the_evaluation(worker):
    """The candidate's process is PID 1 of its own PID namespace: as it is killed, the kernel
    kills the rest of the namespace (within moments; the test allows a minute)."""
    marker = str(uuid.uuid4().int % 10**12)
    verdict = judge(worker, escape("escape_setsid", **{'"4242424242"': f'"{marker}"'}))
    assert verdict.correct, verdict.reason
    deadline = time.monotonic() + 60
    while running_with(marker) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert running_with(marker) == []


def test_the_environment_holds_no_secrets(worker):
    verdict = judge(worker, escape("escape_environment"))
    assert verdict.reason_code is Reason.RUNTIME_ERROR
    assert "secrets seen: {}" in verdict.reason, verdict.reason


def test_there_is_no_network(worker):
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        server.settimeout(0.5)
        port = server.getsockname()[1]
        verdict = judge(worker, escape("escape_network", **{"PORT = 1": f"PORT = {port}"}))
        with pytest.raises(TimeoutError):
            server.accept()
    assert "network refused" in verdict.reason, verdict.reason


def test_no_unix_socket_reaches_a_server_bound_to_a_path(worker, tmp_path):
    path = tmp_path / "server.sock"
    with socket.socket(socket.AF_UNIX) as server:
        server.bind(str(path))
        server.listen()
        server.settimeout(0.5)
        verdict = judge(worker, escape("escape_unix_socket",
                                       **{"/nonexistent/socket": str(path)}))
        with pytest.raises(TimeoutError):
            server.accept()
    assert "unix socket refused" in verdict.reason, verdict.reason


def test_writes_stay_in_the_scratch_folder(worker, tmp_path):
    outside = tmp_path / "outside.txt"
    verdict = judge(worker, escape("escape_write", **{"/nonexistent/outside": str(outside)}))
    assert "outside refused (Permission denied), inside written" in verdict.reason, verdict.reason
    assert not outside.exists()


def test_memory_is_bounded(worker):
    verdict = judge(worker, escape("escape_memory"))
    assert verdict.reason_code is Reason.OUT_OF_MEMORY, verdict.reason


def test_the_judge_cannot_be_signalled(worker):
    """Outside its PID namespace no process exists for it, its /proc shows none (and Landlock
    scopes its signals)."""
    verdict = judge(worker, escape("escape_kill_judge",
                                   **{"JUDGE_PID = 0": f"JUDGE_PID = {worker.process.pid}"}))
    assert "kill attempts: ['No such process']" in verdict.reason, verdict.reason
    assert worker.alive


def test_a_tensor_subclass_does_not_cross_to_the_judge(worker):
    verdict = judge(worker, escape("escape_tensor_subclass"))
    assert verdict.reason_code is Reason.OUTPUT_STRUCTURE, verdict.reason
    assert "tensor subclass" in verdict.reason
