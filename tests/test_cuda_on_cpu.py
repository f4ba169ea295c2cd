"""The CPU emulator of CUDA kernels (`tests.cuda_on_cpu`): each GPU semantic it emulates, held
against expectations computed here with PyTorch; the faults it reports instead of hanging; and
compiled candidates run end to end against the problem's own Model."""

from __future__ import annotations

import math
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from generators.cuda.expressions import HELPERS
from generators.cuda.program import write_cuda_program
from tests.compiler_cases import ALL_CASES, check
from tests.cuda_on_cpu import CompileError, KernelFault, kernels_on_cpu, load_kernel

SHUFFLES = r"""
extern "C++" {
template <class T>
__device__ void shuffle(const T* in, T* out, int mode, int arg, int width) {
    const int t = blockIdx.x * blockDim.x + threadIdx.x;
    const T value = in[t];
    if (mode == 0) { out[t] = __shfl_xor_sync(0xffffffffu, value, arg, width); }
    if (mode == 1) { out[t] = __shfl_up_sync(0xffffffffu, value, arg, width); }
    if (mode == 2) { out[t] = __shfl_down_sync(0xffffffffu, value, arg, width); }
    // A source lane of each thread's own, past the width (and the warp) for some.
    if (mode == 3) { out[t] = __shfl_sync(0xffffffffu, value, (threadIdx.x % 32 * 5 + arg) % 37,
                                          width); }
}
}
__global__ void shuffle_float(const float* in, float* out, int mode, int arg, int width) {
    shuffle(in, out, mode, arg, width);
}
__global__ void shuffle_long(const long long* in, long long* out, int mode, int arg, int width) {
    shuffle(in, out, mode, arg, width);
}
"""
MODES = {"xor": 0, "up": 1, "down": 2, "idx": 3}
THREADS, BLOCKS = 64, 2


def shuffle_sources(mode: str, arg: int, width: int) -> list[int]:
    """Which thread each thread reads, as the CUDA programming guide describes the shuffles."""
    sources = []
    for t in range(THREADS * BLOCKS):
        lane, warp = t % 32, t - t % 32
        start = lane - lane % width
        if mode == "xor":  # a later group's lane gives the thread its own value
            source = lane ^ arg if (lane ^ arg) < start + width else lane
        elif mode == "up":
            source = lane - arg if lane - arg >= start else lane
        elif mode == "down":
            source = lane + arg if lane + arg < start + width else lane
        else:
            source = start + (lane * 5 + arg) % 37 % width
        sources.append(warp + source)
    return sources


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64])
@pytest.mark.parametrize("width", [4, 8, 32])
@pytest.mark.parametrize("mode,arg", [("xor", 1), ("xor", 3), ("xor", 12), ("xor", 16),
                                      ("up", 1), ("up", 5), ("down", 2), ("down", 7),
                                      ("idx", 0), ("idx", 9)])
def test_shuffles_move_values_between_lanes_as_on_the_gpu(dtype, width, mode, arg):
    name = "shuffle_float" if dtype == torch.float32 else "shuffle_long"
    values = (torch.randn(THREADS * BLOCKS) if dtype == torch.float32
              else torch.arange(THREADS * BLOCKS, dtype=torch.int64) * (1 << 33) - (1 << 40))
    out = torch.empty_like(values)
    load_kernel(SHUFFLES, name, "PPiii")(grid=(BLOCKS, 1, 1), block=(THREADS, 1, 1),
                                         args=(values, out, MODES[mode], arg, width))
    assert torch.equal(out, values[shuffle_sources(mode, arg, width)])


BLOCK_SUM = r"""
__global__ void __launch_bounds__(256) block_sum(const float* __restrict__ in,
                                                 float* __restrict__ out) {
    __shared__ float part[256];
    part[threadIdx.x] = in[blockIdx.x * 256 + threadIdx.x];
    __syncthreads();
    for (int half = 128; half > 0; half >>= 1) {
        if (threadIdx.x < half) { part[threadIdx.x] += part[threadIdx.x + half]; }
        SYNC
    }
    if (threadIdx.x == 0) { out[blockIdx.x] = part[0]; }
}
"""


def tree_sum(x: torch.Tensor) -> torch.Tensor:
    """Each row summed as `block_sum` adds, halves onto halves."""
    while x.shape[1] > 1:
        x = x[:, : x.shape[1] // 2] + x[:, x.shape[1] // 2:]
    return x[:, 0]


def test_syncthreads_orders_a_blocks_shared_memory():
    x, out = torch.randn(5, 256), torch.empty(5)
    kernel = load_kernel(BLOCK_SUM.replace("SYNC", "__syncthreads();"), "block_sum", "PP")
    kernel(grid=(5, 1, 1), block=(256, 1, 1), args=(x, out))
    assert torch.equal(out, tree_sum(x))


def test_a_missing_syncthreads_reads_what_other_warps_have_not_written_yet():
    # A warp runs ahead as far as the barriers let it: without one, it reads slots the other
    # warps have not yet added to, as it may on a GPU.
    x, out = torch.randn(5, 256), torch.empty(5)
    load_kernel(BLOCK_SUM.replace("SYNC", ""), "block_sum", "PP")(
        grid=(5, 1, 1), block=(256, 1, 1), args=(x, out))
    assert not torch.allclose(out, tree_sum(x))


def test_a_warp_overwrites_shared_memory_others_still_read_without_a_second_barrier():
    # Each warp's lane 0 posts the warp's sum, the block adds the posts, twice over the same
    # slots: without the barrier after the reads, a warp that ran ahead overwrites its slot
    # before the warps behind it have read it.
    source = r"""
    __global__ void twice(const float* in, float* out) {
        __shared__ float posts[4];
        float total = 0.0f;
        for (int round = 0; round < 2; ++round) {
            float v = in[round * 128 + threadIdx.x];
            for (int hop = 16; hop > 0; hop >>= 1) { v += __shfl_xor_sync(0xffffffffu, v, hop); }
            if (threadIdx.x % 32 == 0) { posts[threadIdx.x / 32] = v; }
            __syncthreads();
            total += posts[0] + posts[1] + posts[2] + posts[3];
            SYNC
        }
        out[threadIdx.x] = total;
    }
    """
    x = torch.arange(256, dtype=torch.float32)
    want = torch.full((128,), float(x.sum()))
    for barrier, right in (("__syncthreads();", True), ("", False)):
        out = torch.empty(128)
        load_kernel(source.replace("SYNC", barrier), "twice", "PP")(
            grid=(2, 1, 1), block=(128, 1, 1), args=(x, out))
        assert torch.equal(out, want) == right


def test_every_block_and_thread_sees_its_own_coordinates():
    source = r"""
    __global__ void where(int* out) {
        const int block = (blockIdx.z * gridDim.y + blockIdx.y) * gridDim.x + blockIdx.x;
        const int thread = (threadIdx.z * blockDim.y + threadIdx.y) * blockDim.x + threadIdx.x;
        int* at = out + (block * blockDim.x * blockDim.y * blockDim.z + thread) * 9;
        const int seen[9] = {(int)blockIdx.x, (int)blockIdx.y, (int)blockIdx.z,
                             (int)threadIdx.x, (int)threadIdx.y, (int)threadIdx.z,
                             (int)(gridDim.x * gridDim.y * gridDim.z),
                             (int)(blockDim.x * blockDim.y * blockDim.z), warpSize};
        for (int i = 0; i < 9; ++i) { at[i] = seen[i]; }
    }
    """
    grid, block = (3, 2, 2), (8, 4, 2)
    out = torch.full((12, 64, 9), -1, dtype=torch.int32)
    load_kernel(source, "where", "P")(grid=grid, block=block, args=(out,))
    bz, by, bx = torch.meshgrid(*[torch.arange(n) for n in reversed(grid)], indexing="ij")
    tz, ty, tx = torch.meshgrid(*[torch.arange(n) for n in reversed(block)], indexing="ij")
    blocks = torch.stack([bx, by, bz], -1).reshape(12, 1, 3).expand(12, 64, 3)
    threads = torch.stack([tx, ty, tz], -1).reshape(1, 64, 3).expand(12, 64, 3)
    sizes = torch.tensor([12, 64, 32]).expand(12, 64, 3)
    assert torch.equal(out, torch.cat([blocks, threads, sizes], -1).int())


CONVERSIONS = HELPERS + r"""
__global__ void narrow(const float* x, unsigned short* half_bits, unsigned short* bf16_bits,
                       int n) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
        half_bits[i] = float_to_half(x[i]);
        bf16_bits[i] = float_to_bf16(x[i]);
    }
}

__global__ void widen(const unsigned short* bits, float* from_half, float* from_bf16, int n) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
        from_half[i] = half_to_float(bits[i]);
        from_bf16[i] = bf16_to_float(bits[i]);
    }
}

__global__ void elementwise(const float* a, const float* b, float* out, int n) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
        out[i] = nan_max(a[i], b[i]);
        out[n + i] = nan_min(a[i], b[i]);
        out[2 * n + i] = sigmoid(a[i]);
        out[3 * n + i] = __fdividef(a[i], b[i]);
        out[4 * n + i] = __expf(a[i]);
        out[5 * n + i] = rsqrtf(b[i]);
    }
}
"""


def ties(mantissa_bits: int) -> torch.Tensor:
    """Floats halfway between neighbours of a format with `mantissa_bits`, at a few exponents,
    and the floats just beside them."""
    steps = torch.arange(1, 64, dtype=torch.float64)
    centres = torch.cat([(1 + (steps + 0.5) * 2.0 ** -mantissa_bits) * 2.0 ** e
                         for e in (-3, 0, 7)]).float()
    beside = centres.view(torch.int32)
    return torch.cat([centres, (beside + 1).view(torch.float32), (beside - 1).view(torch.float32)])


def test_float_to_half_and_bf16_round_to_nearest_even_as_torch_does():
    torch.manual_seed(0)
    special = torch.tensor([0.0, -0.0, math.inf, -math.inf, math.nan, 65504.0, 65519.99, 65520.0,
                            -65520.0, 2.0 ** -24, 2.0 ** -25, 3 * 2.0 ** -25, 1.5 * 2.0 ** -24,
                            2.0 ** -14, 2.0 ** -14 - 2.0 ** -25, 1e-40, -1e-45, 3.4e38])
    # Every exponent: random bit patterns, NaNs and subnormals among them.
    random = torch.randint(-2 ** 31, 2 ** 31, (1 << 18,), dtype=torch.int64).int()
    x = torch.cat([special, ties(10), ties(7), random.view(torch.float32),
                   -random.view(torch.float32)])
    half_bits, bf16_bits = torch.empty_like(x, dtype=torch.int16), torch.empty_like(
        x, dtype=torch.int16)
    load_kernel(CONVERSIONS, "narrow", "PPPi")(grid=(16, 1, 1), block=(128, 1, 1),
                                               args=(x, half_bits, bf16_bits, x.numel()))
    nan = x.isnan()
    assert torch.equal(half_bits[~nan], x[~nan].half().view(torch.int16))
    assert torch.equal(bf16_bits[~nan], x[~nan].bfloat16().view(torch.int16))
    # NaN becomes the GPU's canonical NaN, whatever its sign and payload.
    assert nan.sum() > 100 and bool((half_bits[nan] == 0x7FFF).all())
    assert bool((bf16_bits[nan] == 0x7FFF).all())


def test_every_half_and_bf16_widens_as_torch_does():
    bits = torch.arange(-2 ** 15, 2 ** 15, dtype=torch.int32).short()
    from_half, from_bf16 = torch.empty(2 ** 16), torch.empty(2 ** 16)
    load_kernel(CONVERSIONS, "widen", "PPPi")(grid=(8, 1, 1), block=(256, 1, 1),
                                              args=(bits, from_half, from_bf16, 2 ** 16))
    halves = bits.view(torch.float16)
    nan = halves.isnan()
    assert torch.equal(from_half[~nan].view(torch.int32),
                       halves[~nan].float().view(torch.int32))
    assert bool((from_half[nan].view(torch.int32) == 0x7FFFFFFF).all())
    assert torch.equal(from_bf16.view(torch.int32), bits.view(torch.bfloat16).float().view(
        torch.int32))


def test_nan_max_min_and_the_fast_intrinsics_keep_their_gpu_meaning():
    torch.manual_seed(0)
    a = torch.cat([torch.randn(500) * 10, torch.tensor([math.nan, 1.0, math.nan, -math.inf,
                                                        -100.0, 1.0, math.inf, 3.0])])
    b = torch.cat([torch.randn(500) * 10, torch.tensor([1.0, math.nan, math.nan, 2.0, 1.0,
                                                        2.0 ** 127, 2.0 ** 127, -2.0 ** 127])])
    n = a.numel()
    out = torch.empty(6, n)
    load_kernel(CONVERSIONS, "elementwise", "PPPi")(grid=(2, 1, 1), block=(128, 1, 1),
                                                    args=(a, b, out, n))
    torch.testing.assert_close(out[0], torch.maximum(a, b), rtol=0, atol=0, equal_nan=True)
    torch.testing.assert_close(out[1], torch.minimum(a, b), rtol=0, atol=0, equal_nan=True)
    # The hardware exp2 and reciprocal: a few 1e-6 relative.
    torch.testing.assert_close(out[2, :500], torch.sigmoid(a[:500]), rtol=1e-5, atol=0)
    assert out[2, n - 4] == 0.0  # sigmoid(-100): the denominator passes 2^126, the quotient is 0
    torch.testing.assert_close(out[3, :500], a[:500] / b[:500], rtol=1e-6, atol=0)
    # Past 2^126 __fdividef gives a signed zero, or NaN for an infinite numerator.
    assert out[3, n - 3] == 0.0 and out[3, n - 2].isnan()
    assert out[3, n - 1] == 0.0 and math.copysign(1.0, out[3, n - 1]) == -1.0
    torch.testing.assert_close(out[4, :500], torch.exp(a[:500]), rtol=1e-5, atol=0)
    positive = b[:500] > 0
    torch.testing.assert_close(out[5, :500][positive], torch.rsqrt(b[:500][positive]))


def test_the_bit_casts_reinterpret():
    source = r"""
    __global__ void casts(float* f, int* i) {
        f[0] = __int_as_float(0x7f800000);
        f[1] = __int_as_float(0xff800000);
        f[2] = __uint_as_float(0x3f800000u);
        i[0] = __float_as_int(-2.0f);
        i[1] = (int)__float_as_uint(1.0f);
    }
    """
    f, i = torch.empty(3), torch.empty(2, dtype=torch.int32)
    load_kernel(source, "casts", "PP")(grid=(1, 1, 1), block=(1, 1, 1), args=(f, i))
    assert f.tolist() == [math.inf, -math.inf, 1.0]
    assert i.tolist() == [torch.tensor(-2.0).view(torch.int32).item(), 0x3F800000]


def fault(source: str, threads: int = 64) -> str:
    out = torch.zeros(threads)
    with pytest.raises(KernelFault) as raised:
        load_kernel(source, "k", "P")(grid=(2, 1, 1), block=(threads, 1, 1), args=(out,))
    return str(raised.value)


def test_a_syncthreads_some_threads_skip_is_reported_not_hung():
    message = fault("""__global__ void k(float* out) {
        if (threadIdx.x >= 32) { return; }
        __syncthreads();
        out[threadIdx.x] = 1.0f;
    }""")
    assert message.startswith("k: block (0, 0, 0): its threads cannot all go on")
    assert "threads 0-31 wait at __syncthreads on line 3; threads 32-63 returned" in message


def test_a_shuffle_half_a_warp_skips_is_reported():
    message = fault("""__global__ void k(float* out) {
        float v = threadIdx.x;
        if (threadIdx.x % 32 < 16) { v = __shfl_xor_sync(0xffffffffu, v, 1); }
        __syncthreads();
        out[threadIdx.x] = v;
    }""")
    assert "threads 0-15 wait at __shfl_xor_sync on line 3" in message
    assert "threads 16-31 wait at __syncthreads on line 4" in message


def test_a_shuffle_whose_mask_leaves_out_lanes_is_refused():
    message = fault("""__global__ void k(float* out) {
        out[threadIdx.x] = __shfl_down_sync(0xffffu, 1.0f, 1, 16);
    }""")
    assert "__shfl_down_sync on line 2: mask 0xffff leaves out lanes of warp 0" in message


def test_a_compile_error_carries_the_compilers_message():
    with pytest.raises(CompileError, match=r"kernel\.cu:2:.*'undeclared' was not declared"):
        load_kernel("__global__ void k(float* out) {\n    out[0] = undeclared;\n}\n", "k", "P")


def test_arguments_must_match_the_kernels_parameters():
    source = "__global__ void k(long long* out, long long n, int m) { out[0] = n + m; }"
    with pytest.raises(TypeError, match="codes 'Pqi'.* gives 'Pii'"):
        load_kernel(source, "k", "Pii")
    with pytest.raises(LookupError, match="no __global__ function 'other'"):
        load_kernel(source, "other", "Pqi")
    out = torch.zeros(1, dtype=torch.int64)
    load_kernel(source, "k", "Pqi")(grid=(1, 1, 1), block=(1, 1, 1), args=(out, 1 << 40, -2))
    assert out.item() == (1 << 40) - 2


def test_a_launch_past_the_launch_bounds_is_refused():
    kernel = load_kernel("__global__ void __launch_bounds__(128) k(float* out) {}", "k", "P")
    with pytest.raises(ValueError, match=r"256 threads a block, past its __launch_bounds__\(128"):
        kernel(grid=(1, 1, 1), block=(256, 1, 1), args=(torch.zeros(1),))


@pytest.mark.parametrize(("grid", "block", "why"), [
    ((1, 65536, 1), (128, 1, 1), "65535 along y and z: put the largest count on x"),
    ((0, 1, 1), (128, 1, 1), "an empty dimension: skip the launch"),
    ((1, 1, 1), (32, 32, 2), "a block has at most 1024"),
])
def test_a_launch_no_gpu_takes_is_refused_with_the_limit_it_passes(grid, block, why):
    """The runtime's own check (`core.runtime.cuda.launch_error`), where the driver says only
    "invalid argument"."""
    kernel = load_kernel("__global__ void k(float* out) {}", "k", "P")
    with pytest.raises(ValueError, match=why):
        kernel(grid=grid, block=block, args=(torch.zeros(1),))


REVERSE = r"""
extern __shared__ __align__(16) float staged[];
__global__ void reverse(const float* x, float* out, int n) {
    const int i = blockIdx.x * n + threadIdx.x;
    staged[threadIdx.x] = x[i];
    __syncthreads();
    out[i] = staged[n - 1 - threadIdx.x];
}
"""


def test_dynamic_shared_memory_holds_a_block_and_is_bounded_as_on_sm90():
    x, out = torch.randn(3, 96), torch.empty(3, 96)
    kernel = load_kernel(REVERSE, "reverse", "PPi")
    kernel(grid=(3, 1, 1), block=(96, 1, 1), args=(x, out, 96), shared_mem=96 * 4)
    assert torch.equal(out, x.flip(1))
    with pytest.raises(ValueError, match="more than a sm_90 block may have"):
        kernel(grid=(3, 1, 1), block=(96, 1, 1), args=(x, out, 96), shared_mem=228 * 1024)


def test_a_kernel_that_never_ends_ends_the_process_after_the_timeout(tmp_path):
    script = textwrap.dedent("""
        import torch
        from tests.cuda_on_cpu import load_kernel
        source = "__global__ void k(float* out) { while (out[0] == 0.0f) {} }"
        load_kernel(source, "k", "P", timeout_s=0.5)(grid=(1, 1, 1), block=(1, 1, 1),
                                                     args=(torch.zeros(1),))
    """)
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                            cwd=Path(__file__).parents[1], timeout=120, check=False)
    assert result.returncode == 70, result.stderr
    assert "k ran past 0.5 s on the CPU" in result.stderr


# Between them: splits over several launches, rows wider than a warp (shared memory), scans
# (shfl_up and shfl), argmax pairs, fp16 and bf16 storage, two kernels with a buffer between.
END_TO_END = ["torch.softmax(x, dim=-1) of torch.randn(4, 11, 13, dtype=torch.float16)",
              "F.layer_norm(x, x.shape[1:]) of torch.randn(4, 11, 13, dtype=torch.bfloat16)",
              "torch.var(x, dim=(0, 2)) of torch.randn(5, 7, 9)",
              "torch.argmax(x, dim=1) of torch.randint(0, 4, (6, 9, 5)).float()",
              "torch.cumsum(x, dim=1) of torch.randn(5, 37)",
              "F.cross_entropy(x, t) of torch.randn(23, 10), torch.randint(0, 10, (23,))"]


@pytest.mark.parametrize("case", [c for c in ALL_CASES if c.id in END_TO_END],
                         ids=lambda c: c.id.split(" of ")[0])
def test_compiled_candidates_match_pytorch_on_the_cpu(tmp_path, case):
    with kernels_on_cpu():
        check(tmp_path / "site", case, write_cuda_program)
