"""The compiler coverage benchmark's --shrink: a problem's module-level sizes made small, whether
written as literals or as arithmetic on them, everything else left as written."""

from __future__ import annotations

from bench.compiler_coverage_bench import shrunk


def test_sizes_written_as_literals_or_arithmetic_shrink():
    source = ("M = 256 * 8  # 2048\nK = 131072 * 8\nshape = (4096, 33, 2 ** 10)\nsmall = 7\n"
              "eps = 1e-5\nname = 'x'\nneg = -3\ndim = K // 2\n")
    assert shrunk(source) == ("M = 16\nK = 32\nshape = (16, 17, 16,)\nsmall = 7\neps = 1e-5\n"
                              "name = 'x'\nneg = -3\ndim = K // 2\n")


def test_channels_keep_several_values_a_group():
    source = "batch_size = 1024\nhidden_size = 8192\nnum_groups = 512\nkernel = 3\n"
    assert shrunk(source) == ("batch_size = 16\nhidden_size = 32\nnum_groups = 16\n"
                              "kernel = 3\n")


def test_chained_and_unpacked_sizes_shrink_too():
    source = "batch = 128\nheight = width = 256\nD, H, W = 24, 32, 33\n"
    assert shrunk(source) == "batch = 16\nheight = width = 32\nD, H, W = 16, 16, 17\n"
