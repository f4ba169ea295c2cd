"""Why a kernel that won its site made the model slower: one forward's kernels with it and
without it, side by side.

A kernel can beat its site alone and still cost the model time: inductor no longer fuses across
the site's edge, a copy brings a tensor into the layout the kernel wants, a boundary adds
launches. The end-to-end check takes such a kernel out; what changed between the two forwards
names the cause, and goes with the kernel's removal into the report and the store. On a GPU the
kernels are the device's, timed by the profiler; on the CPU they are aten's ops, by their own
CPU time.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile

# Kernels named on each side of a difference, the costliest first.
SHOWN = 3
NAME_CHARS = 60


@dataclass(frozen=True)
class KernelTimes:
    """One forward's kernels: calls and milliseconds by name."""

    calls: dict[str, int]
    ms: dict[str, float]

    @property
    def launches(self) -> int:
        return sum(self.calls.values())

    @property
    def total_ms(self) -> float:
        return sum(self.ms.values())


def kernel_times(model: Callable, inputs: Sequence[object], device: str) -> KernelTimes:
    """The kernels of one forward of `model`, after one forward that warms it (compiles,
    autotunes) outside the profile."""
    cuda = device == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with torch.no_grad():
        model(*inputs)
        if cuda:
            torch.cuda.synchronize()
        with profile(activities=activities) as profiled:
            model(*inputs)
            if cuda:
                torch.cuda.synchronize()
    calls: dict[str, int] = {}
    ms: dict[str, float] = {}
    for event in profiled.events():
        if cuda:
            if event.device_type != DeviceType.CUDA:
                continue
            spent = event.time_range.elapsed_us() / 1e3
        else:
            if not event.name.startswith("aten::"):
                continue
            spent = event.self_cpu_time_total / 1e3
        calls[event.name] = calls.get(event.name, 0) + 1
        ms[event.name] = ms.get(event.name, 0.0) + spent
    return KernelTimes(calls, ms)


def _named(found: dict[str, float], calls: dict[str, int]) -> str:
    costliest = sorted(found.items(), key=lambda kv: -kv[1])
    names = [f"{_short(name)} {spent:.4f} ms ({calls[name]}x)"
             for name, spent in costliest[:SHOWN]]
    more = len(costliest) - SHOWN
    return ", ".join(names) + (f" and {more} more" if more > 0 else "")


def _short(name: str) -> str:
    return name if len(name) <= NAME_CHARS else name[: NAME_CHARS - 1] + "…"


def describe(with_it: KernelTimes, without: KernelTimes) -> str:
    """What one forward ran with the kernel and without it, and the kernels that differ: those
    only one side ran, and those the kernel's side spent longer in."""
    parts = [f"one forward ran {with_it.launches} kernels in {with_it.total_ms:.4f} ms with "
             f"it, {without.launches} in {without.total_ms:.4f} ms without"]
    added = {n: t for n, t in with_it.ms.items() if n not in without.ms}
    gone = {n: t for n, t in without.ms.items() if n not in with_it.ms}
    slower = {n: t - without.ms[n] for n, t in with_it.ms.items()
              if n in without.ms and t > without.ms[n]}
    if added:
        parts.append("only with it: " + _named(added, with_it.calls))
    if gone:
        parts.append("only without: " + _named(gone, without.calls))
    if slower:
        parts.append("longer with it (by): " + _named(slower, with_it.calls))
    return "; ".join(parts)
