"""Kiln's own convolution against cuDNN's, on the development set's convolutions.

    python bench/conv_gemm_bench.py [--only NAME,...] [--batch-scale F]

For each convolution of shared/kernelbench-dev's level 2 (at its size, fp32, the bias left to
the kernels after it as the compiled sites leave it): cuDNN on the input as given, cuDNN on
channels-last input (its conversion included), and `generators.triton.conv_gemm._convolve`, the
implicit GEMM a compiled conv site may call instead (`Schedule.library_layout == "gemm"`).
Medians of `triton.testing.do_bench` (L2 cleared before each call), with the floors: the
input's and output's bytes at the GPU's measured bandwidth, and the products at its TF32 peak.
Each Kiln result is checked against cuDNN's first (fp32 TF32 tolerance: 3e-4 of the output's
largest magnitude). Prints a table.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from core.profile.gpu_peaks import device_peaks  # noqa: E402
from generators.compiler.library import channels_last  # noqa: E402
from generators.triton.conv_gemm import CONVOLVE_SOURCE  # noqa: E402


@dataclass(frozen=True)
class Conv:
    name: str
    input: tuple[int, ...]
    weight: tuple[int, ...]


# Level 2's convolutions but 19's (transposed: cuDNN's alone).
CONVS = (
    Conv("17 conv2d 64->128 3x3", (128, 64, 128, 128), (128, 64, 3, 3)),
    Conv("23/24 conv3d 3->24 3x3x3", (128, 3, 24, 32, 32), (24, 3, 3, 3, 3)),
    Conv("52 conv2d 64->128 3x3", (64, 64, 128, 128), (128, 64, 3, 3)),
    Conv("92 conv2d 8->64 3x3", (128, 8, 128, 128), (64, 8, 3, 3)),
)


def convolve_function():
    """`_convolve`, defined as a candidate defines it."""
    import triton
    import triton.language as tl

    namespace = {"torch": torch, "triton": triton, "tl": tl}
    path = Path("kiln-out/conv_gemm_bench/convolve.py")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("import torch\nimport triton\nimport triton.language as tl\n"
                    + CONVOLVE_SOURCE)
    exec(compile(path.read_text(), str(path), "exec"), namespace)  # triton reads the file
    return namespace["_convolve"]


def row(conv: Conv, batch_scale: float, convolve, peaks) -> str:
    """One convolution's line of the table."""
    from triton.testing import do_bench

    shape = (max(1, int(conv.input[0] * batch_scale)), *conv.input[1:])
    x = torch.randn(shape, device="cuda")
    w = torch.randn(conv.weight, device="cuda") * 0.1
    conv_call = {4: torch.nn.functional.conv2d, 5: torch.nn.functional.conv3d}[x.dim()]
    last = channels_last(x.dim())
    ones, zeros = [1] * (x.dim() - 2), [0] * (x.dim() - 2)
    reference = conv_call(x, w)
    error = ((convolve(x, w, ones, zeros, ones) - reference).abs().max()
             / reference.abs().max()).item()
    given = do_bench(lambda: conv_call(x, w), return_mode="median")
    laid = do_bench(lambda: conv_call(x.contiguous(memory_format=last), w), return_mode="median")
    kiln = do_bench(lambda: convolve(x, w, ones, zeros, ones), return_mode="median")
    read, written = x.numel() * x.element_size(), reference.numel() * x.element_size()
    flops = 2 * reference.numel() * w[0].numel()
    bytes_ms = peaks.bytes_seconds(read, written) * 1e3
    tf32_ms = flops / peaks.matrix_peak(torch.float32, tf32=True) * 1e3
    return (f"| {conv.name} {tuple(shape)} | {given:.4f} | {laid:.4f} | {kiln:.4f} "
            f"| {bytes_ms:.4f} | {tf32_ms:.4f} | {min(given, laid) / kiln:.2f}x | {error:.1e} |")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="", help="comma-separated name prefixes")
    parser.add_argument("--batch-scale", type=float, default=1.0,
                        help="scale each batch (to fit a smaller GPU)")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("conv_gemm_bench: needs an NVIDIA GPU", file=sys.stderr)
        return 2
    convolve = convolve_function()
    peaks = device_peaks("cuda")
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}")
    print("| conv | cuDNN ms | cuDNN channels-last ms | Kiln ms | floor ms (bytes) "
          "| floor ms (TF32) | Kiln vs cuDNN's best | max error / scale |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    wanted = [w for w in args.only.split(",") if w]
    for conv in CONVS:
        if not wanted or any(conv.name.startswith(w) for w in wanted):
            print(row(conv, args.batch_scale, convolve, peaks), flush=True)
            torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
