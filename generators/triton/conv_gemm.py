"""Kiln's own convolution, where a compiled site's schedule asks for it in place of cuDNN's
(`Schedule.library_layout == "gemm"`): an implicit GEMM in Triton.

Each program computes a tile of BLOCK_M output channels × BLOCK_N output positions of one
sample: the weight as a [channels out, channels in × kernel window] matrix, times the input's
values gathered at each position's window (the padding read as zeros), accumulated in fp32 by
tensor-core dots over the window in steps of BLOCK_K (fp32 as three TF32 products for short
windows, one for long ones). It writes the output contiguous, as the planned kernels after it
read it. Grouped and transposed convolutions stay cuDNN's.

It was written because cuDNN was far from both of its floors where a convolution has few input
channels (level 2's 3-channel Conv3d took nine times what its output's bytes take). As it stands
it is slower still: 4-6 times cuDNN's time on each of level 2's convolutions, so no draft uses
it (bench/NOTES.md, 2026-12-07, 20:29-; bench/results/conv_gemm_h100.md).
"""

from __future__ import annotations

CONVOLVE_SOURCE = '''
@triton.jit
def _conv_gemm_kernel(
    x_ptr, w_ptr, out_ptr, C_OUT, P,
    xs_n, xs_c, xs_d, xs_h, xs_w,
    D_IN, H_IN, W_IN, H_OUT, W_OUT,
    SD, SH, SW, PD, PH, PW, DD, DH, DW,
    K: tl.constexpr, KH: tl.constexpr, KW: tl.constexpr, KD: tl.constexpr,
    PRODUCTS: tl.constexpr, WIDEN: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):
    # One sample a grid row; its positions' tiles sweep each block of output channels.
    pid = tl.program_id(0)
    sample = tl.program_id(1).to(tl.int64)
    tiles_n = tl.cdiv(P, BLOCK_N)
    rows = (pid // tiles_n) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = (pid % tiles_n) * BLOCK_N + tl.arange(0, BLOCK_N)
    ow = cols % W_OUT
    oh = (cols // W_OUT) % H_OUT
    od = cols // (W_OUT * H_OUT)
    base = x_ptr + sample * xs_n
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k = k0 + tl.arange(0, BLOCK_K)
        kw = k % KW
        kh = (k // KW) % KH
        kd = (k // (KW * KH)) % KD
        ci = k // (KW * KH * KD)
        a = tl.load(w_ptr + rows[:, None] * K + k[None, :],
                    mask=(rows < C_OUT)[:, None] & (k < K)[None, :], other=0.0)
        di = od[None, :] * SD - PD + kd[:, None] * DD
        hi = oh[None, :] * SH - PH + kh[:, None] * DH
        wi = ow[None, :] * SW - PW + kw[:, None] * DW
        inside = ((k < K)[:, None] & (cols < P)[None, :] & (di >= 0) & (di < D_IN)
                  & (hi >= 0) & (hi < H_IN) & (wi >= 0) & (wi < W_IN))
        b = tl.load(base + ci[:, None] * xs_c + di * xs_d + hi * xs_h + wi * xs_w,
                    mask=inside, other=0.0)
        if WIDEN:
            a = a.to(tl.float32)
            b = b.to(tl.float32)
        if PRODUCTS == 3:
            acc = tl.dot(a, b, acc, input_precision="tf32x3")
        elif PRODUCTS == 1:
            acc = tl.dot(a, b, acc, input_precision="tf32")
        else:
            acc = tl.dot(a, b, acc)
    mask = (rows < C_OUT)[:, None] & (cols < P)[None, :]
    out = out_ptr + sample * C_OUT * P + rows[:, None] * P + cols[None, :]
    tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=mask)


def _convolve(x, w, stride, padding, dilation):
    """x convolved by w (no bias, one group), as the implicit GEMM above: the output
    contiguous."""
    lead = 3 - (x.dim() - 2)  # 1D and 2D convolutions as 3D ones with leading sizes of 1
    size = [1] * lead + list(x.shape[2:])
    window = [1] * lead + list(w.shape[2:])
    steps, gaps = ([1] * lead + list(s) for s in (stride, dilation))
    pads = [0] * lead + list(padding)
    reach = [g * (k - 1) + 1 for g, k in zip(gaps, window)]
    out_size = [(n + 2 * p - r) // s + 1 for n, p, r, s in zip(size, pads, reach, steps)]
    strides = [0] * lead + list(x.stride()[2:])
    out = torch.empty((x.shape[0], w.shape[0], *out_size[lead:]), device=x.device,
                      dtype=x.dtype)
    positions = out_size[0] * out_size[1] * out_size[2]
    weights = w.reshape(w.shape[0], -1)
    assert weights.is_contiguous() and weights.shape[1] == x.shape[1] * window[0] * window[1] \\
        * window[2], "the weight must be one group's, contiguous"
    assert x[0].numel() < 2**31 and out[0].numel() < 2**31, (
        "one sample of the input and of the output must have fewer than 2**31 elements")
    # Output channels a tile: all of them up to 64 (each tile gathers the window again).
    block_m = min(64, max(16, triton.next_power_of_2(w.shape[0])))
    grid = (triton.cdiv(w.shape[0], block_m) * triton.cdiv(positions, 128), x.shape[0])
    _conv_gemm_kernel[grid](
        x, weights, out, w.shape[0], positions,
        x.stride(0), x.stride(1), *strides,
        *size, out_size[1], out_size[2], *steps, *pads, *gaps,
        K=weights.shape[1], KH=window[1], KW=window[2], KD=window[0],
        # fp32 as three TF32 products where the window is short (the products cost little
        # beside the output's bytes, and a norm after the convolution magnifies TF32's
        # rounding), as one where it is long, as cuDNN multiplies fp32; half precision as is.
        PRODUCTS=(3 if weights.shape[1] <= 128 else 1) if x.dtype == torch.float32 else 0,
        # The Triton interpreter (CPU tensors) multiplies bf16 wrongly: widen to fp32 there.
        WIDEN=x.device.type != "cuda",
        BLOCK_M=block_m, BLOCK_N=128, BLOCK_K=32 if weights.shape[1] > 16 else 16,
        # A warp for each 2048 values of the accumulator: 64 of them a thread.
        num_warps=max(4, block_m * 128 // 2048), num_stages=3,
    )
    return out
'''
