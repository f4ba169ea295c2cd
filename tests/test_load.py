"""MODEL specs: KernelBench files, callables and built-ins, seeded, on a device and dtype."""

from __future__ import annotations

import pytest
import torch

from core.profile.load import BuiltinShape, check_runs, load_model
from core.runtime.errors import KilnInputError
from tests import models

CPU = torch.device("cpu")
EXAMPLE = "examples/mlp_block.py"


def test_kernelbench_file_is_built_seeded():
    first = load_model(EXAMPLE, CPU, seed=3)
    second = load_model(EXAMPLE, CPU, seed=3)
    other = load_model(EXAMPLE, CPU, seed=4)
    for a, b in zip(first.model.parameters(), second.model.parameters(), strict=True):
        assert torch.equal(a, b)
    assert torch.equal(first.inputs[0], second.inputs[0])
    assert not torch.equal(first.inputs[0], other.inputs[0])
    assert first.name == "mlp_block" and not first.model.training


DRAWN_WHERE = """
import torch
import torch.nn as nn

DRAWN_ON = []


class Model(nn.Module):
    def forward(self, x):
        return x * 2


def get_inputs():
    DRAWN_ON.append(torch.empty(0).device.type)
    return [torch.randn(8)]


def get_init_inputs():
    return []
"""


def test_a_kernelbench_files_inputs_are_drawn_on_the_device(tmp_path):
    # Drawn where they are used, not by the CPU and copied: a problem's inputs can be
    # gigabytes. The meta device stands for a GPU here.
    path = tmp_path / "drawn_where.py"
    path.write_text(DRAWN_WHERE)
    loaded = load_model(str(path), torch.device("meta"))
    assert type(loaded.model).forward.__globals__["DRAWN_ON"] == ["meta"]
    assert loaded.inputs[0].device.type == "meta"


def test_callable_spec_returns_model_and_inputs():
    loaded = load_model("tests.models:make_cnn", CPU)
    assert isinstance(loaded.model, models.SmallCNN)
    assert loaded.inputs[0].shape == (2, 3, 16, 16)


def test_dtype_casts_model_and_floating_inputs_only():
    loaded = load_model(models.GPT2_TINY, CPU, dtype="bf16", shape=BuiltinShape(2, 8))
    assert all(p.dtype == torch.bfloat16 for p in loaded.model.parameters())
    assert loaded.inputs[0].dtype == torch.int64  # token ids stay integers
    check_runs(loaded, "bf16")


def test_hf_builtin_takes_config_overrides_and_shape():
    loaded = load_model(models.GPT2_TINY, CPU, shape=BuiltinShape(batch=3, seq_len=8))
    assert loaded.model.config.n_layer == 2 and loaded.model.config.n_embd == 64
    assert loaded.inputs[0].shape == (3, 8)


@pytest.mark.parametrize(
    ("spec", "dtype", "problem"),
    [
        ("no/such/model.py", None, "no such file"),
        ("tests/models.py", None, "has no Model or get_inputs"),
        ("tests.models:make_raising", None, "raised ValueError: checkpoint missing"),
        ("tests.models:no_such_function", None, "has no callable"),
        ("hf:no_such_architecture", None, "no model type 'no_such_architecture'"),
        ("hf:gpt2?n_layer=2&n_embd=128", None,
         "building hf:gpt2 from its config (n_layer=2, n_embd=128) raised ValueError"),
        ("not a spec at all", None, "cannot read the model spec"),
        ("examples/mlp_block.py", "fp8", "unknown dtype"),
    ],
)
def test_bad_specs_name_the_problem_and_the_fix(spec, dtype, problem):
    with pytest.raises(KilnInputError) as err:
        load_model(spec, CPU, dtype=dtype)
    assert problem in err.value.problem
    assert err.value.fix


def test_model_returning_no_tensor_is_refused():
    loaded = load_model("tests.models:make_returns_nothing", CPU)
    with pytest.raises(KilnInputError, match="no tensor"):
        check_runs(loaded, None)


def test_dtype_the_model_rejects_is_refused_with_the_fix():
    loaded = load_model("tests.models:make_fixed_precision", CPU, dtype="fp16")
    with pytest.raises(KilnInputError, match="under --dtype fp16") as err:
        check_runs(loaded, "fp16")
    assert "--dtype fp32" in err.value.fix
