"""The byte floor of a region: each input read once and each output written once, but an input
read twice when a reduction folds it in sets larger than the L2 and its result then works on
every element of that input again (nothing can hold such a set on chip until its statistic is
known)."""

from __future__ import annotations

import pytest
import torch

from core.profile.roofline import GpuPeaks, region_cost
from core.runtime.capture import capture

FP32 = 4


class Lambda(torch.nn.Module):
    def __init__(self, body: str) -> None:
        super().__init__()
        self.body = eval(f"lambda x: {body}", {"torch": torch})

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)


def region_bytes(body: str, x: torch.Tensor, l2_bytes: int) -> int:
    (graph,) = capture(Lambda(body), [x], torch.device("cpu")).graphs
    (region,) = [r for r in graph.regions if r.nodes]
    return region_cost(region, GpuPeaks(l2_bytes=l2_bytes)).bytes


X = torch.randn(64, 256)  # 64 KB; a row is 1 KB
SMALL_L2, LARGE_L2 = 4 << 10, 50 << 20


@pytest.mark.parametrize(("body", "l2_bytes", "reads"), [
    # The whole tensor's norm (64 KB) is one set: read again past a 4 KB L2, not past 50 MB.
    ("x / torch.norm(x)", SMALL_L2, 2),
    ("x / torch.norm(x)", LARGE_L2, 1),
    # Sets of a row (1 KB) fit either L2: one read.
    ("x / torch.norm(x, dim=1, keepdim=True)", SMALL_L2, 1),
    ("torch.softmax(x, dim=1)", SMALL_L2, 1),
    # A reduction whose result works on no full-size value: one read.
    ("torch.sum(x) * 2.0", SMALL_L2, 1),
], ids=["a norm of the whole tensor, past the L2", "a norm of the whole tensor, within it",
        "a norm a row", "a softmax a row", "a sum alone"])
def test_an_input_is_read_again_only_when_its_sets_overflow_the_l2(body, l2_bytes, reads):
    written = FP32 * (1 if "sum(x) " in body else X.numel())
    assert region_bytes(body, X, l2_bytes) == reads * FP32 * X.numel() + written


def test_the_floor_grows_with_the_second_read():
    peaks = GpuPeaks(l2_bytes=SMALL_L2)
    (graph,) = capture(Lambda("x / torch.norm(x)"), [X], torch.device("cpu")).graphs
    (region,) = [r for r in graph.regions if r.nodes]
    read, written = 2 * FP32 * X.numel(), FP32 * X.numel()
    assert region_cost(region, peaks).floor_ms == pytest.approx(
        peaks.bytes_seconds(read, written) * 1e3)
