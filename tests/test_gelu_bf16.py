"""GELU whose result is rounded to bfloat16: the tanh form, one unit from PyTorch's at most."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from generators.compiler.schedule import Schedule
from generators.cuda.pointwise import CudaPointwiseConfig, write_cuda_pointwise
from generators.op_table import GELU_EXP2_CUBIC, GELU_EXP2_SCALE
from generators.site_graph import load_site_graph
from generators.triton.program import write_compiled
from tests.kernel_checks import one_input_problem


def test_the_tanh_form_is_within_its_stated_error_of_the_exact_gelu():
    x = torch.linspace(-12.0, 12.0, 480_001, dtype=torch.float64)
    approx = x / (1.0 + torch.exp2(x * (-GELU_EXP2_SCALE - GELU_EXP2_CUBIC * x * x)))
    error = (approx - F.gelu(x)).abs()
    worst = int(error.argmax())
    assert error[worst] < 4.8e-4, f"error {error[worst]:.3g} at x = {x[worst]:.4f}"


def units_apart(actual: torch.Tensor, expected: torch.Tensor) -> torch.Tensor:
    """How many representable 16-bit values lie between each pair (same sign or zero)."""
    a, e = actual.view(torch.int16).int(), expected.view(torch.int16).int()
    same_sign = (a < 0) == (e < 0)
    zero = (actual == 0) & (expected == 0)
    assert bool((same_sign | zero).all()), "a result changed sign"
    return (a - e).abs()


def test_triton_gelu_of_bf16_values_is_one_unit_of_pytorchs_at_most(tmp_path):
    path = one_input_problem(tmp_path, "torch.nn.functional.gelu(x)",
                             "torch.randn(200, 200).bfloat16() * 2")
    source = write_compiled(load_site_graph(path), Schedule(1, 1024, 4))
    assert "= gelu_bf16(" in source and "def gelu_exact" not in source
    namespace: dict = {}
    exec(compile(source, "model_new.py", "exec"), namespace)
    # The bf16 values from -8 to 8, and randn draws, as the site's rank-2 input.
    x = torch.cat([torch.linspace(-8.0, 8.0, 20_000), torch.randn(20_000) * 2])
    x = x.bfloat16().reshape(200, 200)
    actual, expected = namespace["ModelNew"]()(x).flatten(), F.gelu(x).flatten()
    x = x.flatten()
    large = expected.float().abs() >= 0.05
    apart = units_apart(actual[large], expected[large])
    worst = int(apart.argmax())
    assert apart[worst] <= 1, (f"{int(apart[worst])} units apart at x = {x[large][worst].item()}: "
                               f"{actual[large][worst].item()} against "
                               f"{expected[large][worst].item()}")
    error = (actual.float() - expected.float()).abs()
    worst = int(error.argmax())
    assert error[worst] <= 4.8e-4 or large[worst], (
        f"{error[worst]:.3g} off at x = {x[worst].item()}: {actual[worst].item()} against "
        f"{expected[worst].item()}")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
def test_fp32_and_fp16_gelu_keep_the_exact_form(dtype, tmp_path):
    path = one_input_problem(tmp_path, "torch.nn.functional.gelu(x)",
                             f"torch.randn(8, 8).to({dtype})")
    source = write_compiled(load_site_graph(path), Schedule(1, 64, 4))
    assert "= gelu_exact(" in source and "gelu_bf16" not in source


@pytest.mark.parametrize("dtype,form", [(torch.bfloat16, "exp2f("), (torch.float16, "erff("),
                                        (torch.float32, "erff(")], ids=str)
def test_cuda_gelu_takes_the_same_form_by_the_result_dtype(dtype, form, tmp_path):
    path = one_input_problem(tmp_path, "torch.nn.functional.gelu(x)",
                             f"torch.randn(8, 8).to({dtype})")
    source = write_cuda_pointwise(load_site_graph(path), CudaPointwiseConfig())
    assert form in source, source
    assert ("erff(" in source) == (dtype != torch.bfloat16)
