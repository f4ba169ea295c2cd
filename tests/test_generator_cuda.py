"""Rules CUDA for pointwise and row-reduction sites: every source it writes compiles for sm_90,
the sites it cannot handle say why, and on a GPU the evaluator accepts what it writes."""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch

from core.evaluate import EvalConfig, evaluate
from core.evaluate.static_rules import check_candidate
from core.evaluate.verdict import Reason
from core.runtime.cuda import nvcc_check
from generators.cuda.pointwise import CudaPointwiseConfig, write_cuda_pointwise
from generators.cuda.row_reduction import CudaReductionConfig, write_cuda_reduction
from generators.site_graph import Unsupported, load_site_graph

DTYPES = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16"}
# Each dtype compiles with its own config, so every config is compiled for every site kind.
CONFIG_OF_DTYPE = {"fp32": 0, "fp16": 1, "bf16": 2}

# Pointwise chains that between them use every op of the CUDA expression table that a captured
# graph can spell (F.logsigmoid captures as `log_sigmoid`, an op no region takes).
POINTWISE = {
    "arith": ("x, y", [(4, 8), (8,)], """
        v = torch.add(x, y, alpha=2.0)
        v = torch.sub(v, y, alpha=0.5) - y
        v = torch.mul(v, y) * 1.5
        v = torch.true_divide(v, y.abs() + 1.0)
        v = torch.div(v, 1.3, rounding_mode='floor') + torch.div(v, 1.7, rounding_mode='trunc')
        v = torch.rsub(v, 2.0)
        v = torch.multiply(v, y) + torch.subtract(v, y) + torch.divide(v, 3.0)
        v = torch.pow(v, 2) + torch.pow(v, -1) + torch.pow(y.abs(), 0.5) + torch.pow(v, 0)
        v = v + torch.pow(y.abs(), 1.7)
        v = -v + torch.negative(v) + torch.square(v) + torch.reciprocal(v + 3.0)
        v = torch.maximum(v, y) + torch.minimum(v, y)
        v = torch.floor(v) + torch.ceil(v)"""),
    "compare": ("x, y", [(4, 8), (8,)], """
        v = torch.where(x > y, x, y) + torch.where(x < y, x, 0.0)
        v = v + (x >= y).float() + (x <= y).float() + (x == y).float() + (x != y).float()
        v = v + torch.greater(x, y).float() + torch.less(x, y).float()
        v = v + torch.logical_not(x > 0).float() + (~(x > 0)).float()
        v = v.masked_fill(x > 1.0, 0.25)
        v = v.half().float() + v.bfloat16().float() + v.to(torch.float16).float()
        v = v + (x > 0).type_as(y)
        v = torch.clamp(v, -1.0, 1.0) + torch.clip(v, min=-0.5)
        v = torch.clamp_min(v, 0.1) + torch.clamp_max(v, 0.9)"""),
    "activations": ("x, y", [(4, 8), (8,)], """
        v = torch.relu(x) + F.relu6(y) + F.hardsigmoid(x) + F.hardswish(y) + F.mish(x)
        v = v + F.softsign(y) + F.gelu(x) + F.gelu(y, approximate='tanh')
        v = v + torch.sigmoid(x) + torch.tanh(y) + F.silu(x) + F.leaky_relu(y, 0.1)
        v = v + F.elu(x, 0.7) + F.softplus(y, beta=2.0, threshold=10.0) + F.hardtanh(x, -0.5, 0.5)
        v = v + torch.exp(x) + torch.log(y.abs() + 1.0) + torch.sqrt(y.abs())
        v = v + torch.rsqrt(y.abs() + 1.0) + torch.sin(x) + torch.cos(y) + torch.erf(x)
        v = v + torch.exp2(y) + torch.log2(x.abs() + 1.0) + torch.log1p(y.abs())
        v = v + torch.expm1(x)"""),
    "batch_norm": ("x, m, var, w, b", [(2, 3, 4, 5), (3,), "torch.rand(3) + 0.5", (3,), (3,)], """
        v = F.batch_norm(x, m, var, w, b, False, 0.1, 1e-5)
        v = torch.relu(v)"""),
}
EXPRESSION_OPS = set("""add sub mul div true_divide multiply subtract divide rsub eq ne lt le gt ge
    greater less neg negative abs exp log sqrt rsqrt reciprocal square sigmoid tanh silu sin cos erf
    exp2 log2 log1p expm1 floor ceil relu relu6 hardsigmoid hardswish mish softsign logical_not
    bitwise_not float half bfloat16 to type_as gelu pow clamp clip hardtanh clamp_min clamp_max
    maximum minimum leaky_relu elu softplus where masked_fill batch_norm""".split())

# Row reductions with a prologue (ops before) and an epilogue (ops after) on the row.
REDUCTION = {
    "softmax": ("x, b", [(3, 5, 40), (40,)], """
        v = torch.softmax(x * 0.5 + b, dim=-1)
        v = v * 2.0"""),
    "log_softmax": ("x", [(6, 33)], """
        v = F.log_softmax(torch.tanh(x), -1) + 1.0"""),
    "layer_norm": ("x, w, b, s", [(4, 5, 32), (32,), (32,), (1,)], """
        h = x * s
        v = F.layer_norm(h, (32,), w, b, 1e-5)
        v = torch.relu(v) + h"""),
    "rms_norm": ("x, w", [(7, 48), (48,)], """
        v = F.silu(F.rms_norm(x + 1.0, (48,), w))"""),
    "sum": ("x", [(4, 5, 32)], """
        v = torch.sqrt(torch.exp(x).sum(-1, keepdim=True) * 2.0)"""),
    "mean": ("x", [(9, 20)], """
        v = (x * x).mean(dim=-1) + 1.0"""),
    "amax": ("x", [(3, 70)], """
        v = torch.amax(torch.abs(x), dim=-1, keepdim=True)"""),
}
POINTWISE_CONFIGS = [CudaPointwiseConfig(), CudaPointwiseConfig(threads=128, vector_bytes=8)]
REDUCTION_CONFIGS = [CudaReductionConfig(), CudaReductionConfig(threads=128, rows_per_block=8),
                     CudaReductionConfig(threads=1024, rows_per_block=2)]


def problem_source(params: str, shapes: list[tuple[int, ...] | str], body: str,
                   dtype: str) -> str:
    # A shape draws normal values; a string is a draw of its own (a positive variance).
    draws = ", ".join(f"({shape if isinstance(shape, str) else f'torch.randn({shape})'})"
                      f".to(torch.{DTYPES[dtype]})" for shape in shapes)
    return ("import torch\nimport torch.nn as nn\nimport torch.nn.functional as F\n\n\n"
            f"class Model(nn.Module):\n    def forward(self, {params}):{body}\n        return v\n"
            f"\n\ndef get_inputs():\n    return [{draws}]\n\n\ndef get_init_inputs():\n"
            "    return []\n")


def write_problem(folder: Path, family: dict, name: str, dtype: str) -> Path:
    path = folder / f"{name}_{dtype}" / "problem.py"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(problem_source(*family[name], dtype))
    return path


def candidates() -> list[tuple[str, str, str]]:
    """(name, family, dtype): every site in every dtype."""
    cases = [(name, "pointwise", dtype) for name in POINTWISE for dtype in DTYPES]
    return cases + [(name, "reduction", dtype) for name in REDUCTION for dtype in DTYPES]


def generate(path: Path, family: str, config_index: int) -> str:
    graph = load_site_graph(path)
    if family == "pointwise":
        return write_cuda_pointwise(graph, POINTWISE_CONFIGS[config_index % 2])
    return write_cuda_reduction(graph, REDUCTION_CONFIGS[config_index % 3])


@pytest.fixture(scope="module")
def compiled(tmp_path_factory) -> dict[str, tuple[str, bool, str]]:
    """name → (candidate source, nvcc ok, nvcc log); nvcc runs in parallel, one per core."""
    folder = tmp_path_factory.mktemp("cuda_sites")
    sources: dict[str, tuple[str, str]] = {}
    for name, family, dtype in candidates():
        table = POINTWISE if family == "pointwise" else REDUCTION
        path = write_problem(folder, table, name, dtype)
        source = generate(path, family, CONFIG_OF_DTYPE[dtype])
        report = check_candidate(source, path.read_text())
        assert report.ok and report.tier == "cuda", (name, dtype, report.violations)
        (cuda,) = [text for _, text in report.cuda_sources]
        sources[f"{name}-{dtype}"] = (source, cuda)
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
        results = dict(zip(sources, pool.map(lambda pair: nvcc_check(pair[1]),
                                             sources.values()), strict=True))
    return {key: (sources[key][0], *results[key]) for key in sources}


@pytest.mark.parametrize("name,family,dtype", candidates())
def test_every_generated_source_compiles_for_sm90(compiled, name, family, dtype):
    source, ok, log = compiled[f"{name}-{dtype}"]
    assert ok, f"nvcc rejected the {family} kernel for {name} ({dtype}):\n{log}\n\n{source}"
    assert f"Kiln rules kernel (cuda, {family})" in source


def test_the_pointwise_sites_cover_the_expression_table(tmp_path):
    seen = set()
    for name in POINTWISE:
        seen |= {op.name for op in load_site_graph(
            write_problem(tmp_path, POINTWISE, name, "fp32")).ops}
    assert seen >= EXPRESSION_OPS, f"never exercised: {sorted(EXPRESSION_OPS - seen)}"


def test_configs_shape_the_kernels(compiled):
    vector = compiled["activations-fp32"][0]
    assert "VEC = 4" in vector and "const uint4 raw0" in vector  # 16 bytes of fp32
    assert "VEC = 8" in compiled["activations-bf16"][0]  # 16 bytes of bf16
    narrow = compiled["activations-fp16"][0]
    assert "VEC = 4" in narrow and "const uint2 raw0" in narrow  # 8-byte vectors
    assert "THREADS = 128" in narrow
    shared = compiled["layer_norm-bf16"][0]
    assert "#define ROWS 2" in shared and "#define WARPS_PER_ROW 16" in shared
    warp_rows = compiled["rms_norm-fp16"][0]
    assert "#define THREADS_PER_ROW 16" in warp_rows and "__shared__" not in warp_rows
    assert "welford_merge(count, mean, m2, 1.0f" in shared
    assert "softmax_merge(row_max, row_sum" in compiled["softmax-bf16"][0]


def test_the_evaluator_compile_checks_a_generated_candidate_on_a_cpu(compiled, tmp_path):
    path = write_problem(tmp_path, REDUCTION, "softmax", "fp16")
    verdict = evaluate(path, compiled["softmax-fp16"][0], EvalConfig(device="cpu"))
    assert verdict.compiled and verdict.tier == "cuda", verdict.reason
    assert verdict.reason_code is Reason.NEEDS_GPU


def site(tmp_path: Path, params: str, shapes: list, body: str, dtype: str = "fp32") -> Path:
    path = tmp_path / "problem.py"
    path.write_text(problem_source(params, shapes, body, dtype))
    return path


@pytest.mark.parametrize("body,reason", [
    ("\n        v = torch.softmax(x, -1)", "softmax is not elementwise"),
    ("\n        v = torch.atan(x) + 1.0", "no elementwise rule for atan"),
])
def test_pointwise_sites_it_cannot_handle_say_why(tmp_path, body, reason):
    path = site(tmp_path, "x", [(4, 8)], body)
    with pytest.raises(Unsupported, match=reason):
        write_cuda_pointwise(load_site_graph(path), CudaPointwiseConfig())


def test_integer_tensors_are_refused_by_name(tmp_path):
    path = tmp_path / "problem.py"
    path.write_text(problem_source("x", [(4, 8)], "\n        v = x * 3 + 1", "fp32")
                    .replace(".to(torch.float32)", ".mul(10).to(torch.int32)"))
    with pytest.raises(Unsupported, match="no CUDA storage rule for torch.int32"):
        write_cuda_pointwise(load_site_graph(path), CudaPointwiseConfig())


@pytest.mark.parametrize("body,reason", [
    ("\n        v = x.sum(0)", "sum over dim 0: the CUDA rules reduce the last dimension"),
    ("\n        v = F.layer_norm(x, (4, 8))", r"layer_norm over \(4, 8\): the CUDA rules "
                                              "normalize the last dimension only"),
    ("\n        v = x.var(-1)", "no CUDA row rule for var"),
    ("\n        v = torch.softmax(x, -1, dtype=torch.float64)", "softmax with dtype"),
    ("\n        v = torch.relu(x)", "the site has 0 reductions"),
])
def test_reduction_sites_it_cannot_handle_say_why(tmp_path, body, reason):
    path = site(tmp_path, "x", [(3, 4, 8)], body)
    with pytest.raises(Unsupported, match=reason):
        write_cuda_reduction(load_site_graph(path), CudaReductionConfig())


def test_reduction_configs_that_cannot_split_rows_are_refused(tmp_path):
    graph = load_site_graph(site(tmp_path, "x", [(4, 8)], "\n        v = torch.softmax(x, -1)"))
    with pytest.raises(Unsupported, match="a power of two per row"):
        write_cuda_reduction(graph, CudaReductionConfig(threads=96, rows_per_block=1))


GPU_SITES = [("pointwise", name, dtype) for name in ("activations", "batch_norm")
             for dtype in DTYPES] + [("reduction", name, dtype) for name in REDUCTION
                                     for dtype in DTYPES]


@pytest.mark.gpu
@pytest.mark.parametrize("family,name,dtype", GPU_SITES)
@pytest.mark.parametrize("config_index", [0, 1, 2])
def test_generated_candidates_are_accepted_on_a_gpu(tmp_path, family, name, dtype, config_index):
    if not torch.cuda.is_available():
        pytest.skip("needs an NVIDIA GPU")
    table = POINTWISE if family == "pointwise" else REDUCTION
    path = write_problem(tmp_path, table, name, dtype)
    source = generate(path, family, config_index)
    verdict = evaluate(path, source, EvalConfig(device="cuda", time=False))
    assert verdict.correct, (f"{name} ({dtype}): {verdict.reason}; max rel err "
                              f"{verdict.max_rel_err}\n{source}")


@pytest.mark.gpu
@pytest.mark.parametrize("shapes,layouts", [
    ([(6, 5), (6, 5)], "torch.randn(5, 6).t(), torch.randn(6, 5)"),  # strided: row kernel
    ([(1037,), (1037,)], "torch.randn(1037), torch.randn(1037)"),  # odd count: row kernel
    ([(64, 256), (256,)], "torch.randn(64, 256), torch.randn(256)"),  # row bias
    ([(64, 256), (64, 256)], "torch.randn(64, 256), torch.randn(64, 256)"),  # vector kernel
    ([(64, 999), (64, 1)], "torch.randn(64, 999), torch.randn(64, 1)"),  # one value per row
    ([(3, 6, 7, 9), (6, 1, 1)], "torch.randn(3, 6, 7, 9), torch.randn(6, 1, 1)"),  # channel
    ([(33, 7), (1, 1)], "torch.randn(33, 7), torch.randn(1, 1)"),  # scalar-like, short rows
    ([(300, 5), (5,)], "torch.randn(5, 300).t(), torch.randn(5)"),  # transposed with a bias
    ([(3, 9000), (9000,)], "torch.randn(3, 9000), torch.randn(9000)"),  # rows of many tiles
])
def test_both_pointwise_kernels_are_right_on_a_gpu(tmp_path, shapes, layouts):
    if not torch.cuda.is_available():
        pytest.skip("needs an NVIDIA GPU")
    path = site(tmp_path, "x, y", shapes, "\n        v = F.gelu(x) * y + x")
    path.write_text(path.read_text().split("def get_inputs")[0]
                    + f"def get_inputs():\n    return [{layouts}]\n\n\n"
                    "def get_init_inputs():\n    return []\n")
    source = write_cuda_pointwise(load_site_graph(path), CudaPointwiseConfig())
    verdict = evaluate(path, source, EvalConfig(device="cuda", time=False))
    assert verdict.correct, f"{verdict.reason}; max rel err {verdict.max_rel_err}"
