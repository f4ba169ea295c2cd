"""The ceilings of the GPU a run is on, so that floors, the diagnoses read against them and the
search's stop at the floor hold on any GPU, not an H200's figures everywhere.

On an H200 they are the measured defaults of `GpuPeaks`. On another GPU its SMs and L2 come from
its properties, and reads and writes both from its memory's bandwidth, its memory clock times its
bus width, double data rate: the datasheet's figure (3.35 TB/s on an H100 SXM), which nothing
reads faster and a copy writes slower, so that a floor stays a floor. Matrix peaks stay an
H200's: the H100 is the same Hopper chip at the same clocks, older GPUs are slower (their floors
then lie lower than they could, never above a time); `--matrix-tflops` sets a newer one's.
"""

from __future__ import annotations

import ctypes
from dataclasses import replace
from functools import cache

import torch

from core.profile.roofline import GpuPeaks

# CUdevice_attribute values (cuda.h): the memory clock in kHz, the global memory bus in bits.
_MEMORY_CLOCK_KHZ = 36
_MEMORY_BUS_BITS = 37


def device_peaks(device: torch.device | str) -> GpuPeaks:
    """The ceilings of `device`: an H200's off a GPU (floors are then only printed) and on an
    H200, the GPU's own elsewhere; an H200's too, named as assumed, where the driver does not
    say how fast the memory is."""
    device = torch.device(device)
    if device.type != "cuda" or not torch.cuda.is_available():
        return GpuPeaks()
    index = device.index if device.index is not None else torch.cuda.current_device()
    return _cuda_peaks(index)


@cache
def _cuda_peaks(index: int) -> GpuPeaks:
    properties = torch.cuda.get_device_properties(index)
    name = properties.name.removeprefix("NVIDIA ")
    if "H200" in name:
        return replace(GpuPeaks(), detected=True)
    bandwidth = memory_bandwidth(index, properties)
    if bandwidth is None:
        return replace(GpuPeaks(), name=f"{name} (H200 ceilings assumed: pass --bandwidth)")
    return peaks_of(name, bandwidth, properties.multi_processor_count,
                    properties.L2_cache_size)


def peaks_of(name: str, bandwidth: float, sms: int, l2_bytes: int) -> GpuPeaks:
    """A GPU's ceilings from its memory bandwidth (bytes/s), SMs and L2 (see the module's
    docstring)."""
    return replace(GpuPeaks().with_bandwidth(bandwidth, name), sms=sms, l2_bytes=l2_bytes,
                   detected=True)


def memory_bandwidth(index: int, properties: object) -> float | None:
    """Bytes a second the memory of GPU `index` moves, from its clock and bus width as torch's
    `properties` of it or the CUDA driver give them; None where neither does."""
    clock_khz = getattr(properties, "memory_clock_rate", None)
    bus_bits = getattr(properties, "memory_bus_width", None)
    if not (clock_khz and bus_bits):
        clock_khz, bus_bits = _driver_attribute(index, _MEMORY_CLOCK_KHZ), \
            _driver_attribute(index, _MEMORY_BUS_BITS)
    if not (clock_khz and bus_bits):
        return None
    return bandwidth_of(clock_khz, bus_bits)


def bandwidth_of(clock_khz: int, bus_bits: int) -> float:
    """Bytes a second of memory at `clock_khz` on a `bus_bits`-wide bus, data moved on both
    edges of the clock."""
    return 2 * clock_khz * 1e3 * bus_bits / 8


def _driver_attribute(index: int, attribute: int) -> int | None:
    """One integer attribute of GPU `index` from the CUDA driver; None where the driver cannot
    be loaded or answers with an error."""
    try:
        driver = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return None
    device, value = ctypes.c_int(), ctypes.c_int()
    if driver.cuInit(0) != 0 or driver.cuDeviceGet(ctypes.byref(device), index) != 0:
        return None
    if driver.cuDeviceGetAttribute(ctypes.byref(value), attribute, device) != 0:
        return None
    return value.value
