"""Why a kernel that won its site lost in the model: one forward's kernels with it and without."""

from __future__ import annotations

import torch

from core.optimize.kernel_diff import SHOWN, KernelTimes, describe, kernel_times


def test_a_forwards_kernels_are_counted_and_timed_by_name():
    layer = torch.nn.Linear(16, 8)

    def forward(x: torch.Tensor) -> torch.Tensor:
        return torch.relu(layer(x)) + torch.relu(layer(x))

    times = kernel_times(forward, [torch.randn(4, 16)], "cpu")
    assert times.calls["aten::relu"] == 2
    assert times.calls["aten::add"] == 1
    assert all(name.startswith("aten::") for name in times.calls)
    assert all(spent >= 0 for spent in times.ms.values())
    assert times.launches == sum(times.calls.values())
    assert times.total_ms == sum(times.ms.values())


def test_the_difference_names_what_only_one_side_ran_and_what_took_longer():
    with_it = KernelTimes({"kiln_conv": 1, "triton_poi_fused_copy": 2, "gemm": 1},
                          {"kiln_conv": 0.3, "triton_poi_fused_copy": 0.05, "gemm": 0.25})
    without = KernelTimes({"cudnn_conv": 1, "triton_per_fused_group_norm": 1, "gemm": 1},
                          {"cudnn_conv": 0.2, "triton_per_fused_group_norm": 0.08, "gemm": 0.2})
    assert describe(with_it, without) == (
        "one forward ran 4 kernels in 0.6000 ms with it, 3 in 0.4800 ms without; "
        "only with it: kiln_conv 0.3000 ms (1x), triton_poi_fused_copy 0.0500 ms (2x); "
        "only without: cudnn_conv 0.2000 ms (1x), triton_per_fused_group_norm 0.0800 ms (1x); "
        "longer with it (by): gemm 0.0500 ms (1x)")


def test_long_lists_and_long_names_are_cut():
    many = {f"kernel_{i}": float(i) for i in range(SHOWN + 2)}
    long_name = "void cutlass::Kernel<cutlass_80_tensorop_s1688gemm_128x128_16x4_nn_align4>"
    with_it = KernelTimes({**dict.fromkeys(many, 1), long_name: 1}, {**many, long_name: 9.0})
    text = describe(with_it, KernelTimes({}, {}))
    assert "only with it: void cutlass::Kernel<cutlass_80_tensorop_s1688gemm_128x128_… 9.0000 ms" \
        in text
    assert text.endswith("and 3 more")
    assert "only without" not in text and "longer with it" not in text
