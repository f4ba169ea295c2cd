"""The op table: every elementwise op's formula, run in both languages, agrees with PyTorch and
with itself.

Each op is written out by both backends. The Triton expression runs on the GPU where there is
one, else under the Triton interpreter; the CUDA expression is compiled as host C++ with g++,
beside the CUDA helpers' own source (those written in PTX get host twins: a rounding to fp16 or
bf16). Both run on the same inputs, NaN among them, and must match PyTorch on the op and each
other.
"""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from core.runtime.ops import OpKind
from generators.cuda.expressions import CUDA, HELPERS
from generators.op_table import CASTS, ELEMENTWISE_OPS, formula
from generators.site_graph import Op, Ref, TensorInfo
from generators.triton.expressions import TRITON, with_jit_helpers

X, Y, Z = (Ref(i, True) for i in range(3))
# The inputs hold NaN and values whose exp overflows on purpose.
pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")


@dataclass(frozen=True)
class Case:
    """One op: its arguments (Refs and constants), what PyTorch computes, on what inputs."""

    name: str
    args: tuple
    reference: object  # (x, y, z) -> tensor, on float32 tensors
    kwargs: dict = field(default_factory=dict)
    out: torch.dtype = torch.float32
    domain: str = "any"  # "any", "positive" (x > 0) or "mask" (z holds 0 and 1)
    atol: float = 2e-6


def _pair(name: str, torch_op) -> Case:
    return Case(name, (X, Y), lambda x, y, z: torch_op(x, y))


def _unary(name: str, domain: str = "any", atol: float = 2e-6) -> Case:
    return Case(name, (X,), lambda x, y, z: getattr(torch, name)(x), domain=domain, atol=atol)


CASES = [
    *[_pair(n, getattr(torch, n)) for n in ("add", "sub", "mul", "div", "true_divide",
                                            "multiply", "subtract", "divide")],
    Case("add", (X, Y), lambda x, y, z: torch.add(x, y, alpha=0.5), kwargs={"alpha": 0.5}),
    Case("div", (X, Y), lambda x, y, z: torch.div(x, y, rounding_mode="floor"),
         kwargs={"rounding_mode": "floor"}),
    Case("div", (X, Y), lambda x, y, z: torch.div(x, y, rounding_mode="trunc"),
         kwargs={"rounding_mode": "trunc"}),
    Case("rsub", (X, 2.5), lambda x, y, z: torch.rsub(x, 2.5)),
    *[Case(n, (X, Y), (lambda x, y, z, n=n: getattr(torch, n)(x, y).float()))
      for n in ("eq", "ne", "lt", "le", "gt", "ge", "greater", "less")],
    *[_unary(n) for n in ("abs", "exp", "sigmoid", "tanh", "sin", "cos", "erf", "exp2",
                          "floor", "ceil", "neg", "negative", "reciprocal", "square")],
    *[_unary(n, "positive") for n in ("log", "log2", "sqrt", "rsqrt")],
    _unary("log1p", "positive"), _unary("expm1", atol=1e-5),
    Case("silu", (X,), lambda x, y, z: F.silu(x)),
    Case("relu", (X,), lambda x, y, z: F.relu(x)),
    Case("relu6", (X,), lambda x, y, z: F.relu6(x)),
    Case("hardsigmoid", (X,), lambda x, y, z: F.hardsigmoid(x)),
    Case("hardswish", (X,), lambda x, y, z: F.hardswish(x)),
    Case("mish", (X,), lambda x, y, z: F.mish(x), atol=1e-5),
    Case("logsigmoid", (X,), lambda x, y, z: F.logsigmoid(x), atol=1e-5),
    Case("softsign", (X,), lambda x, y, z: F.softsign(x)),
    Case("logical_not", (X,), lambda x, y, z: torch.logical_not(x).float()),
    Case("isnan", (X,), lambda x, y, z: torch.isnan(x).float()),
    Case("isinf", (X,), lambda x, y, z: torch.isinf(x).float()),
    Case("sign", (X,), lambda x, y, z: torch.sign(x)),
    Case("trunc", (X,), lambda x, y, z: torch.trunc(x)),
    *[Case(n, (Z, Y), (lambda x, y, z, n=n: getattr(torch, n)(z != 0, y != 0).float()),
           domain="mask")
      for n in ("logical_and", "logical_or", "logical_xor", "bitwise_and", "bitwise_or",
                "bitwise_xor")],
    Case("bitwise_not", (Z,), lambda x, y, z: torch.logical_not(z).float(), domain="mask"),
    *[Case(n, (X,), lambda x, y, z: x) for n in ("dropout", "identity", "detach", "view",
                                                 "reshape", "flatten", "unsqueeze", "squeeze",
                                                 "unflatten", "contiguous", "double", "float")],
    Case("to", (X,), lambda x, y, z: x.half().float(), out=torch.float16),
    Case("half", (X,), lambda x, y, z: x.half().float(), out=torch.float16),
    Case("type_as", (X, Y), lambda x, y, z: x.half().float(), out=torch.float16),
    Case("bfloat16", (X,), lambda x, y, z: x.bfloat16().float(), out=torch.bfloat16),
    Case("gelu", (X,), lambda x, y, z: F.gelu(x), atol=1e-6),
    Case("gelu", (X,), lambda x, y, z: F.gelu(x, approximate="tanh"),
         kwargs={"approximate": "tanh"}, atol=1e-6),
    # The bf16 form is the tanh form, 4.7e-4 at most from the exact GELU before rounding.
    Case("gelu", (X,), lambda x, y, z: F.gelu(x), out=torch.bfloat16, atol=5e-4),
    Case("pow", (X, 2), lambda x, y, z: torch.pow(x, 2)),
    Case("pow", (X, -3), lambda x, y, z: torch.pow(x, -3), domain="positive"),
    Case("pow", (X, 0), lambda x, y, z: torch.pow(x, 0)),
    Case("pow", (X, 0.5), lambda x, y, z: torch.pow(x, 0.5), domain="positive"),
    Case("pow", (X, 1.7), lambda x, y, z: torch.pow(x, 1.7), domain="positive", atol=1e-5),
    Case("clamp", (X, -1.0, 2.0), lambda x, y, z: torch.clamp(x, -1.0, 2.0)),
    Case("clip", (X, None, 0.5), lambda x, y, z: torch.clip(x, None, 0.5)),
    Case("hardtanh", (X,), lambda x, y, z: F.hardtanh(x)),
    Case("clamp_min", (X, 0.25), lambda x, y, z: torch.clamp_min(x, 0.25)),
    Case("clamp_max", (X, Y), lambda x, y, z: torch.clamp_max(x, y)),
    Case("maximum", (X, Y), lambda x, y, z: torch.maximum(x, y)),
    Case("minimum", (X, Y), lambda x, y, z: torch.minimum(x, y)),
    Case("leaky_relu", (X, 0.2), lambda x, y, z: F.leaky_relu(x, 0.2)),
    Case("elu", (X,), lambda x, y, z: F.elu(x), atol=1e-5),
    # SELU and CELU are aten.elu with a scale and an input scale.
    Case("elu", (X, 1.6732632423543772, 1.0507009873554805), lambda x, y, z: F.selu(x),
         atol=1e-5),
    Case("elu", (X, 0.5, 1.0, 2.0), lambda x, y, z: F.celu(x, 0.5), atol=1e-5),
    Case("softplus", (X,), lambda x, y, z: F.softplus(x), atol=1e-5),
    Case("softplus", (X, 2.0, 5.0), lambda x, y, z: F.softplus(x, 2.0, 5.0), atol=1e-5),
    Case("where", (Z, X, Y), lambda x, y, z: torch.where(z != 0, x, y), domain="mask"),
    Case("masked_fill", (X, Z, -7.0), lambda x, y, z: x.masked_fill(z != 0, -7.0),
         domain="mask"),
    Case("batch_norm", (X, Y, Z, Y, Z, False, 0.1, 1e-3),
         lambda x, y, z: (x - y) / torch.sqrt(z + 1e-3) * y + z, domain="variance", atol=1e-5),
]


def _inputs(domain: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Values across each formula's range, large ones and NaN included, the same every run."""
    grid = torch.linspace(-6.0, 6.0, 61)
    special = torch.tensor([0.0, 1e-3, -1e-3, 0.5, -0.5, 20.0, -20.0, 88.0, -88.0, -1e4,
                            float("nan")])
    x = torch.cat([grid, special])
    y = torch.cat([torch.linspace(2.5, -2.4, 61), torch.tensor(
        [1.0, -2.0, 3.0, 0.5, 0.25, -1.5, 7.0, 2.0, 1.0, 3.0, 1.0])])
    z = (torch.arange(x.numel()) % 3 == 0).float()
    if domain == "positive":
        x = x.abs() + 0.05
    elif domain == "variance":
        z = z + y.abs()
    return x, y, z


def _op(case: Case) -> Op:
    return Op(case.name, OpKind.POINTWISE, case.args, tuple(case.kwargs.items()),
              TensorInfo((72,), (1,), case.out))


VALUES = {X: "x0", Y: "x1", Z: "x2"}

_TRITON_KERNEL = '''
@triton.jit
def case_{index}(x0_ptr, x1_ptr, x2_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offsets = tl.arange(0, BLOCK)
    mask = offsets < n
    x0 = tl.load(x0_ptr + offsets, mask=mask, other=0.0)
    x1 = tl.load(x1_ptr + offsets, mask=mask, other=0.0)
    x2 = tl.load(x2_ptr + offsets, mask=mask, other=0.0)
    result = ({expression}).to(tl.float32)
    tl.store(out_ptr + offsets, result, mask=mask)
'''


def run_triton(tmp_path: Path) -> list[torch.Tensor]:
    kernels = "".join(_TRITON_KERNEL.format(index=i, expression=formula(_op(c), VALUES, TRITON))
                      for i, c in enumerate(CASES))
    path = tmp_path / "op_table_triton.py"
    path.write_text(with_jit_helpers("import triton\nimport triton.language as tl\n" + kernels))
    spec = importlib.util.spec_from_file_location("op_table_triton", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    results = []
    for i, case in enumerate(CASES):
        x, y, z = (t.to(device) for t in _inputs(case.domain))
        out = torch.empty_like(x)
        getattr(module, f"case_{i}")[(1,)](x, y, z, out, x.numel(), BLOCK=128)
        results.append(out.cpu())
    return results


# CUDA's device-only spellings, and host twins of the helpers written in PTX.
_HOST_PRELUDE = r"""
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#define __device__
#define __forceinline__ inline
static inline float __int_as_float(int v) { float f; std::memcpy(&f, &v, 4); return f; }
static inline float __uint_as_float(unsigned int v) { float f; std::memcpy(&f, &v, 4); return f; }
#define __expf(x) expf(x)
#define __fdividef(a, b) ((a) / (b))
static inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
static inline unsigned short float_to_half(float v) {
    _Float16 h = (_Float16)v; unsigned short bits; std::memcpy(&bits, &h, 2); return bits;
}
static inline float half_to_float(unsigned short bits) {
    _Float16 h; std::memcpy(&h, &bits, 2); return (float)h;
}
static inline unsigned short float_to_bf16(float v) {
    unsigned int u; std::memcpy(&u, &v, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (unsigned short)((u >> 16) | 0x40u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (unsigned short)(u >> 16);
}
"""

_HOST_MAIN = r"""
int main(int argc, char** argv) {
    const int n = atoi(argv[1]);
    float (*const expression)(float, float, float) = CASES[atoi(argv[2])];
    float* in = new float[3 * n];
    if (fread(in, sizeof(float), 3 * n, stdin) != (size_t)(3 * n)) return 1;
    for (int i = 0; i < n; ++i) {
        const float x0 = in[i], x1 = in[n + i], x2 = in[2 * n + i];
        const float out = expression(x0, x1, x2);
        fwrite(&out, sizeof(float), 1, stdout);
    }
    return 0;
}
"""


def _device_helpers_without_ptx() -> str:
    """HELPERS' own functions, but those whose body is PTX (their host twins are above)."""
    return "\n\n".join(f for f in HELPERS.strip().split("\n\n") if "asm(" not in f)


def run_cuda(tmp_path: Path) -> list[torch.Tensor]:
    compiler = shutil.which("g++")
    if compiler is None:
        pytest.fail("g++ is needed to run the CUDA expressions on the host")
    functions = "".join(
        f"static float case_{i}(float x0, float x1, float x2) {{ (void)x0; (void)x1; (void)x2; "
        f"return {formula(_op(c), VALUES, CUDA)}; }}\n" for i, c in enumerate(CASES))
    table = ", ".join(f"case_{i}" for i in range(len(CASES)))
    source = tmp_path / "op_table_cuda.cpp"
    source.write_text(f"{_HOST_PRELUDE}{_device_helpers_without_ptx()}\n{functions}"
                      f"static float (*const CASES[])(float, float, float) = {{{table}}};\n"
                      f"{_HOST_MAIN}")
    binary = tmp_path / "op_table_cuda"
    built = subprocess.run([compiler, "-std=c++17", "-O1", "-ffp-contract=off", "-w",
                            str(source), "-o", str(binary), "-lm"], capture_output=True, text=True)
    assert built.returncode == 0, built.stderr[-3000:]
    results = []
    for i, case in enumerate(CASES):
        x, y, z = _inputs(case.domain)
        raw = np.concatenate([x.numpy(), y.numpy(), z.numpy()]).astype(np.float32).tobytes()
        ran = subprocess.run([str(binary), str(x.numel()), str(i)], input=raw,
                             capture_output=True, check=True)
        results.append(torch.from_numpy(np.frombuffer(ran.stdout, dtype=np.float32).copy()))
    return results


def _where_they_differ(got: torch.Tensor, want: torch.Tensor, atol: float, x: torch.Tensor,
                       rtol: float = 2e-6) -> str | None:
    nan_differs = torch.isnan(got) != torch.isnan(want)
    close = torch.isclose(got, want, rtol=rtol, atol=atol, equal_nan=True)
    wrong = nan_differs | ~close
    if not wrong.any():
        return None
    i = int(wrong.nonzero()[0])
    return (f"{int(wrong.sum())} of {got.numel()} values differ; first at x = {x[i].item()!r}: "
            f"{got[i].item()!r} against {want[i].item()!r}")


@pytest.fixture(scope="module")
def results(tmp_path_factory) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    folder = tmp_path_factory.mktemp("op_table")
    return run_triton(folder), run_cuda(folder)


def test_every_op_of_the_table_has_a_case() -> None:
    assert {c.name for c in CASES} == set(ELEMENTWISE_OPS)


@pytest.mark.parametrize("index", range(len(CASES)),
                         ids=[f"{c.name}-{i}" for i, c in enumerate(CASES)])
def test_triton_and_cuda_agree_with_pytorch_and_each_other(index: int, results) -> None:
    case = CASES[index]
    x, y, z = _inputs(case.domain)
    with torch.no_grad():
        want = case.reference(x, y, z).float()
    triton_out, cuda_out = results[0][index], results[1][index]
    triton_rtol = 2e-6
    if case.out == torch.bfloat16 and case.name in CASTS and not torch.cuda.is_available():
        # The Triton interpreter rounds to bf16 by truncation, at most one bf16 unit (2^-7
        # relative) from the GPU's round-to-nearest-even; on a GPU this case is exact.
        triton_rtol = 2.0**-7
    problems = {
        "Triton against PyTorch": _where_they_differ(triton_out, want, case.atol, x,
                                                     triton_rtol),
        "CUDA against PyTorch": _where_they_differ(cuda_out, want, case.atol, x),
        "Triton against CUDA": _where_they_differ(triton_out, cuda_out, case.atol, x,
                                                  triton_rtol),
    }
    failed = {k: v for k, v in problems.items() if v}
    expressions = (f"triton: {formula(_op(case), VALUES, TRITON)}\n"
                   f"cuda:   {formula(_op(case), VALUES, CUDA)}")
    assert not failed, f"{case.name}: {failed}\n{expressions}"
