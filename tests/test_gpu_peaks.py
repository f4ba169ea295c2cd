"""The ceilings of the GPU a run is on: an H200's measured figures on an H200 and off a GPU, the
GPU's own SMs, L2 and memory bandwidth elsewhere, and a resumed run reading them again. The GPU's
properties are stood in for here (CI has none); the `gpu` test reads a real one."""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace

import pytest
import torch

from core.evaluate import EvalConfig
from core.optimize import config as optimize_config
from core.optimize.cli import _config, _parse
from core.optimize.config import config_of_settings, gpu_peaks, run_settings
from core.profile import gpu_peaks as gpu_peaks_module
from core.profile.gpu_peaks import bandwidth_of, device_peaks, peaks_of
from core.profile.roofline import GpuPeaks
from core.runtime.errors import KilnInputError

MODEL = "tests.models:make_mlp"
H100_SXM = SimpleNamespace(name="NVIDIA H100 80GB HBM3", multi_processor_count=132,
                           L2_cache_size=50 * 2**20, memory_clock_rate=2_619_000,
                           memory_bus_width=5120)
H100 = peaks_of("H100 80GB HBM3", bandwidth_of(2_619_000, 5120), 132, 50 * 2**20)


@pytest.fixture
def on_gpu(monkeypatch):
    """A CUDA device with the given properties, as torch would describe it."""
    def stand_in(properties: SimpleNamespace) -> None:
        gpu_peaks_module._cuda_peaks.cache_clear()
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
        monkeypatch.setattr(torch.cuda, "get_device_properties", lambda index: properties)
    yield stand_in
    gpu_peaks_module._cuda_peaks.cache_clear()


def test_bandwidth_is_the_memory_clock_times_the_bus_on_both_edges():
    # The H100 SXM's datasheet figure, from its 2619 MHz HBM3 on a 5120-bit bus.
    assert bandwidth_of(2_619_000, 5120) == pytest.approx(3.352e12, rel=1e-3)


def test_off_a_gpu_the_ceilings_are_an_h200s():
    assert device_peaks("cpu") == GpuPeaks()
    assert not device_peaks("cpu").detected


def test_an_h100_gets_its_own_bandwidth_sms_and_l2(on_gpu):
    on_gpu(H100_SXM)
    peaks = device_peaks("cuda")
    assert peaks == H100 and peaks.detected
    assert (peaks.name, peaks.sms, peaks.l2_bytes) == ("H100 80GB HBM3", 132, 50 * 2**20)
    assert peaks.read_bandwidth == peaks.bandwidth == pytest.approx(3.352e12, rel=1e-3)
    assert peaks.matrix_flops == GpuPeaks().matrix_flops


def test_an_h200_keeps_the_measured_figures(on_gpu):
    on_gpu(SimpleNamespace(**{**vars(H100_SXM), "name": "NVIDIA H200",
                              "memory_clock_rate": 3_201_000, "memory_bus_width": 6144}))
    assert device_peaks("cuda") == replace(GpuPeaks(), detected=True)


def test_without_the_memory_clock_an_h200_is_assumed_and_named_so(on_gpu, monkeypatch):
    on_gpu(SimpleNamespace(name="NVIDIA A100-SXM4-80GB", multi_processor_count=108,
                           L2_cache_size=40 * 2**20))
    monkeypatch.setattr(gpu_peaks_module, "_driver_attribute", lambda index, attribute: None)
    peaks = device_peaks("cuda")
    assert peaks.bandwidth == GpuPeaks().bandwidth
    assert peaks.name == "A100-SXM4-80GB (H200 ceilings assumed: pass --bandwidth)"


def test_a_floor_on_an_h100_is_slower_than_on_an_h200_and_still_a_floor():
    read = written = 2**30
    h100 = H100.bytes_seconds(read, written)
    assert h100 > GpuPeaks().bytes_seconds(read, written)
    # A copy of 1 GiB at the H100's datasheet rate is the fastest it could go: no slower floor.
    assert h100 == pytest.approx((read + written) / 3.352e12, rel=1e-3)
    assert H100.impossible_seconds(read, written) <= h100


def test_the_evaluators_impossible_floor_is_the_gpus(on_gpu):
    on_gpu(H100_SXM)
    assert EvalConfig(device="cuda").peaks == H100
    assert EvalConfig(device="cuda", bandwidth_tbps=2.0).peaks.read_bandwidth == 2e12


def test_given_figures_take_the_place_of_the_gpus(on_gpu):
    on_gpu(H100_SXM)
    assert gpu_peaks(None, None, "bf16", "cuda") == H100
    given = gpu_peaks(2.0, 500.0, "bf16", "cuda")
    assert (given.name, given.bandwidth, given.read_bandwidth) == ("custom GPU", 2e12, 2e12)
    assert given.matrix_flops["bf16"] == 500e12 and not given.detected
    assert gpu_peaks(None, None, None, "cpu") == GpuPeaks()


def test_a_resumed_run_reads_the_gpu_again(monkeypatch):
    monkeypatch.setattr(optimize_config, "device_peaks", lambda device: H100)
    config = _config(_parse([MODEL, "--device", "cuda"]))
    assert config.profile.peaks == H100
    settings = run_settings(config)
    assert settings["bandwidth"] is None
    elsewhere = replace(H100, name="H100 PCIe", bandwidth=2.0e12, read_bandwidth=2.0e12)
    monkeypatch.setattr(optimize_config, "device_peaks", lambda device: elsewhere)
    assert config_of_settings(settings, config).profile.peaks == elsewhere


@pytest.mark.parametrize("flag", ["--bandwidth", "--matrix-tflops"])
def test_a_figure_that_is_not_positive_is_refused(flag):
    with pytest.raises(KilnInputError, match=f"{flag} 0.0 is not positive"):
        _parse([MODEL, "--device", "cpu", flag, "0"])


@pytest.mark.gpu
def test_the_gpus_own_bandwidth_is_read():
    peaks = device_peaks("cuda")
    assert peaks.detected
    if "H100" in peaks.name:
        assert peaks.read_bandwidth == pytest.approx(3.35e12, rel=0.05)
    assert 1e12 < peaks.read_bandwidth < 1e13
    assert peaks.sms == torch.cuda.get_device_properties(0).multi_processor_count
