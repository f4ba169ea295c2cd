"""Workers spread over the GPUs of one host: device list, round robin, pinning, one lock per GPU.

No GPU here: the device count is faked; the workers themselves are real processes.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from core.evaluate.config import EvalConfig
from core.evaluate.pool import WorkerPool, pinning_env, pool_gpus, slot_gpus
from core.runtime.errors import KilnInputError
from tests.test_list_sites_cli import ROOT, run_cli


def two_gpus() -> int:
    return 2


def test_every_visible_gpu_unless_some_are_picked():
    assert pool_gpus(EvalConfig(device="cuda"), lambda: 4) == [0, 1, 2, 3]
    assert pool_gpus(EvalConfig(device="cuda", gpus=(3, 1)), lambda: 4) == [3, 1]
    assert pool_gpus(EvalConfig(device="cpu", gpus=(0,)), lambda: 4) == []


def test_a_gpu_that_is_not_there_is_an_input_error():
    with pytest.raises(KilnInputError, match="names GPU 2, but this process sees 2 GPU"):
        pool_gpus(EvalConfig(device="cuda", gpus=(0, 2)), two_gpus)
    with pytest.raises(ValueError, match="distinct"):
        EvalConfig(device="cuda", gpus=(1, 1))


def test_workers_go_round_robin_over_the_gpus():
    assert slot_gpus(5, [0, 1]) == [0, 1, 0, 1, 0]
    assert slot_gpus(1, [0, 1]) == [0]
    assert slot_gpus(3, [2, 5, 7]) == [2, 5, 7]
    assert slot_gpus(2, []) == [None, None]


def test_pinning_maps_through_the_gpus_this_process_was_given():
    assert pinning_env(1, {}) == {"CUDA_VISIBLE_DEVICES": "1"}
    assert pinning_env(1, {"CUDA_VISIBLE_DEVICES": "2,3"}) == {"CUDA_VISIBLE_DEVICES": "3"}
    uuids = {"CUDA_VISIBLE_DEVICES": "GPU-aa11, GPU-bb22"}
    assert pinning_env(0, uuids) == {"CUDA_VISIBLE_DEVICES": "GPU-aa11"}


def test_each_gpu_has_its_own_timing_lock_and_worker_environment():
    pool = WorkerPool(EvalConfig(device="cuda"), workers=3, device_count=two_gpus)
    try:
        assert pool.slot_gpu == [0, 1, 0]
        assert [pool.worker_env(s) for s in range(3)] == [
            {"CUDA_VISIBLE_DEVICES": "0"}, {"CUDA_VISIBLE_DEVICES": "1"},
            {"CUDA_VISIBLE_DEVICES": "0"}]
        locks = [pool.lock_path(s) for s in range(3)]
        assert locks[0] == locks[2] != locks[1]
    finally:
        pool.close()


def test_one_gpu_is_todays_pool_one_lock_for_all_workers():
    pool = WorkerPool(EvalConfig(device="cuda"), workers=3, device_count=lambda: 1)
    try:
        assert pool.slot_gpu == [0, 0, 0]
        assert len({pool.lock_path(s) for s in range(3)}) == 1
    finally:
        pool.close()


def test_a_cpu_pool_pins_nothing():
    pool = WorkerPool(EvalConfig(device="cpu"), workers=2, device_count=two_gpus)
    try:
        assert pool.gpus == [] and pool.worker_env(1) == {}
        assert pool.lock_path(0) == pool.lock_path(1)
    finally:
        pool.close()


def test_a_started_worker_carries_its_gpu_in_its_environment():
    """A real worker process; it only starts here (importing torch needs no CUDA)."""
    pool = WorkerPool(EvalConfig(device="cuda"), workers=2, device_count=two_gpus)
    try:
        worker = pool.new_worker(1)
        environ = Path(f"/proc/{worker.process.pid}/environ").read_bytes().split(b"\0")
        assert b"CUDA_VISIBLE_DEVICES=1" in environ
        worker.close()
    finally:
        pool.close()


@pytest.mark.parametrize(("args", "message"), [
    (["--gpus", "0,x"], "is not a list of distinct GPU indices"),
    (["--gpus", "0,00"], "is not a list of distinct GPU indices"),
    (["--gpus", "0"], "--gpus was given, but the run is on the CPU"),
    (["--ray-address", "auto"], "--ray-address was given without --executor ray"),
])
def test_bad_scale_out_options_are_input_errors(args, message):
    result = run_cli("tests.models:make_mlp", "--device", "cpu", *args)
    assert result.returncode == 2, result.stderr
    assert message in result.stderr and "Traceback" not in result.stderr


def test_executor_ray_without_ray_names_the_extra_to_install():
    hide_ray = ("import sys; sys.modules['ray'] = None\n"
                "from core.runtime.errors import exit_on_input_error\n"
                "from core.optimize.cli import main\n"
                "exit_on_input_error(lambda: main(['tests.models:make_mlp', '--device', 'cpu', "
                "'--executor', 'ray']))")
    result = subprocess.run([sys.executable, "-c", hide_ray], cwd=ROOT, capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 2, result.stderr
    assert "pip install 'kiln[ray]'" in result.stderr and "Traceback" not in result.stderr
