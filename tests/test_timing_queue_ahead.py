"""Timing a call's device work without the Python that issues it: a sleep kernel queued ahead of
each timed call on a GPU, sized by how long recent calls took to issue."""

from __future__ import annotations

import time

import pytest
import torch

from core.timing.timer import MAX_QUEUE_MS, QueueAhead, time_callable, time_once

CPU = torch.device("cpu")


def slow_to_issue(target: torch.Tensor, host_ms: float):
    """A call that spends `host_ms` of Python before launching one tiny op."""

    def call() -> None:
        end = time.perf_counter() + host_ms / 1e3
        while time.perf_counter() < end:
            pass
        target.add_(1)

    return call


def test_on_the_cpu_the_queue_does_nothing_and_the_wall_clock_counts():
    queue = QueueAhead(CPU)
    assert not queue.enabled and queue.sleep_cycles == 0
    assert time_once(slow_to_issue(torch.zeros(4), 2.0), CPU, queue) >= 2.0
    queue()  # nothing to queue on


def test_the_sleep_covers_the_slowest_recent_call_within_the_cap():
    queue = QueueAhead(CPU, margin_ms=0.25)
    queue.cycles_per_ms = 1000.0  # as a GPU's clock would give
    queue.observe(0.5)
    assert queue.sleep_cycles == 1250  # twice 0.5 ms, and the margin
    queue.observe(0.1)
    assert queue.sleep_cycles == 1250  # the slower call is still among the recent ones
    for _ in range(5):
        queue.observe(0.1)
    assert queue.sleep_cycles == 450
    queue.observe(60.0)  # a call that compiled: the next ones sleep the cap, not minutes
    assert queue.sleep_cycles == int(MAX_QUEUE_MS * 1000)
    queue.fit(3.0)  # a time given outright is not capped (a whole model's forward)
    assert queue.sleep_cycles == 6250


def test_the_fastest_clock_a_sleep_ran_at_sizes_the_next():
    queue = QueueAhead(CPU, margin_ms=0.25)
    queue.cycles_per_ms = 1000.0  # measured while the GPU idled at a low clock
    queue.fit(0.5)
    queue.clocked(1250, 0.625)  # the same sleep, at twice the clock
    assert queue.sleep_cycles == 2500
    queue.clocked(1250, 2.5)  # a slower sleep (the GPU shared) does not shorten the next
    assert queue.sleep_cycles == 2500


@pytest.mark.gpu
def test_on_a_gpu_the_python_before_a_launch_is_left_out():
    device = torch.device("cuda")
    target = torch.zeros(1024, device=device)
    call = slow_to_issue(target, 2.0)
    with_python = time_callable(call, device, warmup=3, trials=10).median_ms
    queued = time_callable(call, device, warmup=3, trials=10,
                           queue=QueueAhead(device, margin_ms=0.25)).median_ms
    assert with_python >= 2.0, with_python
    assert queued < 0.2, queued
