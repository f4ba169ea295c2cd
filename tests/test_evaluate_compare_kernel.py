"""The one-pass comparison kernel against the comparison's PyTorch ops: the same counts
(unwritten elements, NaN/Inf mismatches, elements outside the tolerance) and the same largest
errors, in every poisoned dtype, at sizes that end mid-block and span several programs. Run
under the Triton interpreter on the CPU, and on the GPU where there is one."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from core.evaluate.compare_kernel import BLOCK, BLOCKS_PER_PROGRAM, compare_in_one_pass, fusable
from core.evaluate.correctness import _counts, _work_dtype, compare_tensor, reference_scale
from core.evaluate.guard import poison

# Masked lanes and infinities make the interpreter's NumPy warn (inf - inf) before the masks
# drop them.
pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")
ROOT = Path(__file__).resolve().parent.parent
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float64]
TOLERANCE = {torch.float32: 1e-4, torch.float16: 1e-2, torch.bfloat16: 1e-2, torch.float64: 1e-7}
SIZES = [1, 1000, BLOCK * BLOCKS_PER_PROGRAM + 77]  # one element; one program; two


def both_ways(out: torch.Tensor, ref: torch.Tensor) -> tuple[list[float], list[float]]:
    work = _work_dtype(out, ref)
    scale = reference_scale(ref, work)
    tol = TOLERANCE[ref.dtype]
    fused = compare_in_one_pass(out, ref, scale, tol).tolist()
    ops = _counts(out, ref, work, False, scale, tol).tolist()
    return fused, ops


def assert_same(fused: list[float], ops: list[float]) -> None:
    names = ["unwritten", "NaN/Inf", "outside the tolerance", "largest abs error",
             "largest rel error"]
    for name, got, expected in zip(names[:3], fused[:3], ops[:3], strict=True):
        assert got == expected, f"{name}: the kernel counted {got:g}, PyTorch's ops {expected:g}"
    for name, got, expected in zip(names[3:], fused[3:], ops[3:], strict=True):
        assert got == pytest.approx(expected, rel=1e-6, abs=0), (
            f"{name}: the kernel found {got!r}, PyTorch's ops {expected!r}")


def pair(dtype: torch.dtype, n: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    ref = torch.randn(n, generator=generator, dtype=torch.float64).to(dtype)
    return ref.clone().to(DEVICE), ref.to(DEVICE)


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_equal_outputs_count_nothing(dtype, n):
    out, ref = pair(dtype, n)
    fused, ops = both_ways(out, ref)
    assert_same(fused, ops)
    assert fused == [0.0] * 5


@pytest.mark.parametrize("n", SIZES[1:])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_rounding_errors_and_wrong_values(dtype, n):
    out, ref = pair(dtype, n, seed=1)
    noise = torch.randn(n, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    out = (out.double() * (1 + TOLERANCE[dtype] * 0.01 * noise.to(DEVICE))).to(dtype)
    out[::97] += 1.0  # far outside any tolerance
    fused, ops = both_ways(out, ref)
    assert_same(fused, ops)
    assert fused[2] == len(range(0, n, 97)) and fused[3] > 0.5


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_unwritten_and_nan_inf_elements(dtype):
    n = SIZES[2]
    out, ref = pair(dtype, n, seed=3)
    poison(out[10:20])  # never written
    out[100] = float("nan")  # NaN where the reference has none
    out[200] = float("inf")  # an infinity it lacks
    ref[300] = out[300] = float("nan")  # NaN in both: not a mismatch
    ref[400] = out[400] = float("-inf")
    ref[n - 1] = float("inf")  # an infinity the output lacks, in the second program
    fused, ops = both_ways(out, ref)
    assert_same(fused, ops)
    assert fused[:2] == [10.0, 13.0]  # the poison is a NaN: unwritten elements are NaN too


def test_only_plain_pairs_of_a_poisoned_dtype_are_fused():
    x = torch.randn(8, 8, device=DEVICE)
    assert fusable(x, x.clone())
    assert not fusable(x.t(), x.t().clone())  # not contiguous
    assert not fusable(x.int(), x.int())  # no poison pattern: exact comparison
    assert not fusable(x, x.double())
    assert not fusable(x[:0], x[:0])


@pytest.mark.gpu
def test_on_a_gpu_the_comparison_says_what_pytorchs_ops_say():
    out, ref = pair(torch.float32, SIZES[2], seed=4)
    out[5000] += 1.0
    verdict = compare_tensor(0, out, ref, 1e-4, "fp32")  # fused, on the GPU
    cpu = compare_tensor(0, out.cpu(), ref.cpu(), 1e-4, "fp32")  # PyTorch's ops
    assert verdict.mismatch is not None and cpu.mismatch is not None
    assert verdict.mismatch.message == cpu.mismatch.message
    assert verdict.max_rel_err == pytest.approx(cpu.max_rel_err, rel=1e-6)


# Compiled by Triton for sm_90 (no GPU needed), in a process without the interpreter: what the
# interpreter runs, the compiler may still refuse.
SM90 = """
import tempfile, triton, triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from core.evaluate.compare_kernel import BLOCK, BLOCKS_PER_PROGRAM, _compare_kernel

for data, bits, work in [("fp32", tl.int32, tl.float32), ("fp16", tl.int16, tl.float32),
                         ("bf16", tl.int16, tl.float32), ("fp64", tl.int64, tl.float64)]:
    signature = {"out_ptr": "*" + data, "ref_ptr": "*" + data,
                 "params_ptr": "*fp64" if data == "fp64" else "*fp32", "partial_ptr": "*fp64",
                 "n": "i64", "poison": "i64" if data == "fp64" else "i32", "BITS": "constexpr",
                 "WORK": "constexpr", "BLOCK": "constexpr", "BLOCKS": "constexpr"}
    source = ASTSource(_compare_kernel, signature, constexprs={
        "BITS": bits, "WORK": work, "BLOCK": BLOCK, "BLOCKS": BLOCKS_PER_PROGRAM})
    with tempfile.TemporaryDirectory() as cache, triton.knobs.cache.scope():
        triton.knobs.cache.dir = cache
        compiled = triton.compile(source, target=GPUTarget("cuda", 90, 32))
    print(data, len(compiled.asm["ptx"]))
"""


def test_the_kernel_compiles_for_sm90():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = str(ROOT)
    result = subprocess.run([sys.executable, "-c", SM90], capture_output=True, text=True,
                            cwd=ROOT, env=env, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert [line.split()[0] for line in result.stdout.splitlines()] == [
        "fp32", "fp16", "bf16", "fp64"]
