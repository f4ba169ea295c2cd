"""The evaluator on a GPU: overhead, pycuda compile time, pool throughput, timing spread, and its
reference timings against eager timings measured separately. Prints tables; writes nothing.

    python bench/evaluate_bench.py [--workers 4] [--candidates 40]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from core.evaluate import EvalConfig, Evaluator  # noqa: E402
from core.runtime import cuda as cuda_runtime  # noqa: E402
from core.timing.model_timing import rotation_sets, time_model  # noqa: E402

POINTWISE_64MB = '''
import torch
import torch.nn as nn

N = 16 * 1024 * 1024  # 64 MB of fp32 per tensor


class Model(nn.Module):
    def forward(self, x, y):
        return x * y + x


def get_inputs():
    return [torch.randn(N), torch.randn(N)]


def get_init_inputs():
    return []
'''
SOFTMAX_SITE = '''
import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x):
        return torch.softmax(x, dim=-1)


def get_inputs():
    return [torch.randn(128, 16384)]


def get_init_inputs():
    return []
'''
SOFTMAX_CANDIDATE = '''
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def softmax_kernel(x_ptr, out_ptr, cols, stride, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    offsets = tl.arange(0, BLOCK)
    mask = offsets < cols
    x = tl.load(x_ptr + row * stride + offsets, mask=mask, other=-float("inf"))
    x = x - tl.max(x, axis=0) + VARIANT * 0.0
    numerator = tl.exp(x)
    tl.store(out_ptr + row * stride + offsets, numerator / tl.sum(numerator, axis=0), mask=mask)


class ModelNew(nn.Module):
    def forward(self, x):
        rows, cols = x.shape
        out = torch.empty_like(x)
        softmax_kernel[(rows,)](x, out, cols, x.stride(0), BLOCK=triton.next_power_of_2(cols),
                                num_warps=WARPS)
        return out
'''
KERNELBENCH_STYLE = {
    "L1 matmul 2048^2": ('''
import torch
import torch.nn as nn
class Model(nn.Module):
    def forward(self, a, b):
        return torch.matmul(a, b)
def get_inputs():
    return [torch.randn(2048, 2048), torch.randn(2048, 2048)]
def get_init_inputs():
    return []
'''),
    "L1 layernorm 8192x4096": ('''
import torch
import torch.nn as nn
class Model(nn.Module):
    def __init__(self, features):
        super().__init__()
        self.norm = nn.LayerNorm(features)
    def forward(self, x):
        return self.norm(x)
def get_inputs():
    return [torch.randn(8192, 4096)]
def get_init_inputs():
    return [4096]
'''),
    "L1 sum over dim 1": ('''
import torch
import torch.nn as nn
class Model(nn.Module):
    def forward(self, x):
        return torch.sum(x, dim=1, keepdim=True)
def get_inputs():
    return [torch.randn(16, 256, 256)]
def get_init_inputs():
    return []
'''),
    "L2 conv3x3+bias+relu": ('''
import torch
import torch.nn as nn
class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(64, 128, 3, padding=1)
        self.bias = nn.Parameter(torch.randn(128, 1, 1))
    def forward(self, x):
        return torch.relu(self.conv(x) + self.bias)
def get_inputs():
    return [torch.randn(32, 64, 64, 64)]
def get_init_inputs():
    return []
'''),
    "L2 linear+gelu bf16": ('''
import torch
import torch.nn as nn
class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(4096, 4096).to(torch.bfloat16)
    def forward(self, x):
        return torch.nn.functional.gelu(self.linear(x))
def get_inputs():
    return [torch.randn(8192, 4096, dtype=torch.bfloat16)]
def get_init_inputs():
    return []
'''),
}
GOOD_POINTWISE = Path(__file__).resolve().parent.parent / "tests/data/evaluate/good_pointwise.py"


def table(title: str, header: list[str], rows: list[list[str]]) -> None:
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    print(f"\n## {title}\n")
    for row in [header, ["-" * w for w in widths], *rows]:
        print(" | ".join(str(c).ljust(w) for c, w in zip(row, widths, strict=True)))


def overhead_and_spread(folder: Path) -> None:
    problem = folder / "pointwise_64mb.py"
    problem.write_text(POINTWISE_64MB)
    good = GOOD_POINTWISE.read_text()
    with Evaluator(EvalConfig(device="cuda"), workers=1) as evaluator:
        first = evaluator.evaluate(problem, good)
        runs = [evaluator.evaluate(problem, good) for _ in range(10)]
    assert first.accepted and all(v.accepted for v in runs), first.reason
    seconds = [v.eval_seconds for v in runs]
    latencies = [v.latency_ms for v in runs]
    median = statistics.median(latencies)
    table("Evaluation overhead, 64 MB pointwise problem (compile excluded: kernel cached)",
          ["first (with compile) s", "median s", "max s", "target"],
          [[f"{first.eval_seconds:.2f}", f"{statistics.median(seconds):.2f}",
            f"{max(seconds):.2f}", "<= 1.5 s"]])
    table("Same kernel timed 10 times",
          ["median ms", "min ms", "max ms", "spread (max-min)/median", "baseline ms", "target"],
          [[f"{median:.4f}", f"{min(latencies):.4f}", f"{max(latencies):.4f}",
            f"{(max(latencies) - min(latencies)) / median:.2%}",
            f"{runs[0].baseline_ms:.4f}", "<= 3%"]])


def pycuda_compile() -> None:
    cuda_runtime.ensure_context()
    seconds = []
    for i in range(10):
        source = (f"__global__ void scale_{i}(float* x, int n) {{\n"
                  "  int j = blockIdx.x * blockDim.x + threadIdx.x;\n"
                  f"  if (j < n) x[j] *= {i + 2}.0f;\n}}\n")
        began = time.perf_counter()
        unique = (f"-DKILN_BENCH_{time.time_ns()}",)  # defeats pycuda's on-disk cache
        cuda_runtime.load_kernel(source, f"scale_{i}", "Pi", options=unique)
        seconds.append(time.perf_counter() - began)
    table("pycuda compile and load (fresh sources)", ["median s", "max s", "target"],
          [[f"{statistics.median(seconds):.2f}", f"{max(seconds):.2f}", "<= 1 s"]])


def throughput(folder: Path, workers: int, count: int) -> None:
    problem = folder / "softmax_site.py"
    problem.write_text(SOFTMAX_SITE)
    sources = [SOFTMAX_CANDIDATE.replace("VARIANT", f"{i}.0").replace("WARPS", str(4 << (i % 3)))
               for i in range(count)]
    with Evaluator(EvalConfig(device="cuda"), workers=workers) as evaluator:
        evaluator.evaluate_many([(problem, sources[0])] * workers)
        began = time.monotonic()
        verdicts = evaluator.evaluate_many([(problem, s) for s in sources])
        elapsed = time.monotonic() - began
    accepted = sum(v.accepted for v in verdicts)
    table(f"Pool throughput, softmax 128x16384 site, {workers} workers, distinct Triton kernels",
          ["candidates", "accepted", "seconds", "per minute", "target"],
          [[str(count), str(accepted), f"{elapsed:.1f}", f"{count / elapsed * 60:.0f}",
            ">= 30/min"]])


def reference_vs_eager() -> None:
    import triton.testing

    device = torch.device("cuda")
    rows = []
    for name, source in KERNELBENCH_STYLE.items():
        namespace: dict = {}
        exec(compile(source, name, "exec"), namespace)
        torch.manual_seed(0)
        model = namespace["Model"](*namespace["get_init_inputs"]()).to(device).eval()
        inputs = [t.to(device) for t in namespace["get_inputs"]()]
        sets = rotation_sets(inputs, device, 1 << 30)
        ours = time_model(model, sets, device, warmup=10, trials=100).median_ms
        with torch.no_grad():
            eager = triton.testing.do_bench(lambda m=model, x=inputs: m(*x), warmup=25,
                                            rep=200, return_mode="median")
        rows.append([name, f"{ours:.4f}", f"{eager:.4f}", f"{ours / eager:.2f}"])
    table("Reference timing by the evaluator's rules vs eager (triton.testing.do_bench)",
          ["problem", "evaluator ms", "do_bench ms", "ratio"], rows)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--candidates", type=int, default=40)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("this benchmark needs a CUDA GPU", file=sys.stderr)
        return 2
    print(f"# Evaluator benchmark on {torch.cuda.get_device_name()}, torch {torch.__version__}")
    with tempfile.TemporaryDirectory(prefix="kiln-bench-") as folder:
        overhead_and_spread(Path(folder))
        pycuda_compile()
        throughput(Path(folder), args.workers, args.candidates)
    reference_vs_eager()
    return 0


if __name__ == "__main__":
    sys.exit(main())
