"""The benchmark suite: each problem, shrunk, loads and Kiln cuts it into sites of the families
its entry declares; at full size each is big enough to time on an H200; built-in models load.

Problems keep their sizes in module-level constants. The test writes a copy of each file with
the small sizes below and loads the copy through `core.profile.load`, as Kiln loads any model file.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
import torch
from torch.utils._pytree import tree_flatten
from torch.utils.flop_counter import FlopCounterMode

from bench.suite import PROBLEMS, SUITE, SuiteEntry, entry
from core.profile.load import DTYPES, BuiltinShape, check_runs, import_file, load_model
from core.profile.roofline import GpuPeaks
from core.profile.sites import find_sites
from core.runtime.capture import capture
from core.runtime.errors import KilnInputError

CPU = torch.device("cpu")
FILE_ENTRIES = [item for item in SUITE if not item.is_builtin]
# A problem must keep an H200 busy at least as long as moving 64 MiB takes (15.6 µs), counting
# its inputs, weights and outputs once, or its matrix FLOPs at the bf16/fp32 peak.
MIN_FLOOR_S = 64 * 2**20 / GpuPeaks().bandwidth

SMALL_SIZES: dict[str, dict[str, int]] = {
    "linear_bias_gelu": {"TOKENS": 16, "IN_FEATURES": 32, "OUT_FEATURES": 64},
    # Rows wider than a matmul tile holds, as at its size: the norm stays a site of its own.
    "linear_residual_layernorm": {"TOKENS": 16, "HIDDEN": 264},
    "bmm_softcap": {"BATCH_HEADS": 2, "SEQ": 16, "HEAD_DIM": 8},
    "gated_mlp": {"TOKENS": 16, "HIDDEN": 32, "INTERMEDIATE": 48},
    "conv_bias_relu_scale": {"BATCH": 2, "CHANNELS": 4, "SIZE": 8},
    "conv_groupnorm_silu": {"BATCH": 2, "CHANNELS": 8, "SIZE": 8, "GROUPS": 4},
    "depthwise_conv_block": {"BATCH": 2, "CHANNELS": 8, "OUT_CHANNELS": 4, "SIZE": 8},
    "layer_norm": {"ROWS": 16, "HIDDEN": 32},
    "rms_norm": {"ROWS": 16, "HIDDEN": 32},
    "group_norm": {"BATCH": 2, "CHANNELS": 8, "SIZE": 4, "GROUPS": 4},
    "batch_norm": {"BATCH": 4, "CHANNELS": 8, "SIZE": 4},
    "softmax": {"BATCH": 2, "HEADS": 2, "SEQ": 16},
    "log_softmax": {"TOKENS": 16, "VOCAB": 100},
    "softmax_dim1": {"BATCH": 2, "CLASSES": 5, "SIZE": 4},
    "sum_dim1": {"BATCH": 2, "TOKENS": 16, "HIDDEN": 8},
    "mean_dims": {"BATCH": 2, "TOKENS": 16, "HIDDEN": 8},
    "amax_dim0": {"TOKENS": 16, "CHANNELS": 8},
    "sdpa_causal": {"BATCH": 2, "HEADS": 2, "SEQ": 16, "HEAD_DIM": 8},
    "manual_attention": {"BATCH": 2, "HEADS": 2, "SEQ": 16, "HEAD_DIM": 8},
    "causal_attention": {"BATCH": 2, "HEADS": 2, "SEQ": 16, "HEAD_DIM": 8},
    "swish_bias": {"ROWS": 16, "COLUMNS": 32},
    "gelu_tanh": {"ROWS": 16, "COLUMNS": 32},
    "transformer_block": {"BATCH": 2, "SEQ": 16, "HIDDEN": 32, "HEADS": 4},
}
def shrunk_copy(item: SuiteEntry, folder: Path) -> Path:
    """A copy of the entry's problem file with its size constants set to SMALL_SIZES."""
    source = item.problem_file.read_text()
    for name, value in SMALL_SIZES[item.problem_file.stem].items():
        source, count = re.subn(rf"^{name} = .+$", f"{name} = {value!r}", source, flags=re.M)
        assert count == 1, f"{item.problem_file.name}: expected one line `{name} = ...`"
    path = folder / item.problem_file.name
    path.write_text(source)
    return path


def site_signatures(spec: str, dtype: str, shape: BuiltinShape | None = None) -> list[str]:
    """'family: op → op' for each site Kiln finds in the model, as --list-sites would."""
    loaded = load_model(spec, CPU, dtype, shape=shape or BuiltinShape())
    check_runs(loaded, dtype)
    table = find_sites(capture(loaded.model, loaded.inputs, CPU), GpuPeaks())
    return [f"{site.family}: {site.problem.signature.split(' | ')[0]}" for site in table.sites]


def assert_families(item: SuiteEntry, signatures: list[str]) -> None:
    found = {signature.split(":")[0] for signature in signatures}
    missing = set(item.expects) - found
    assert not missing, f"{item.name}: no {sorted(missing)} site; sites found: {signatures}"


def test_every_problem_file_has_one_entry_and_small_sizes():
    files = sorted(path.name for path in PROBLEMS.glob("*.py"))
    entries = sorted({item.problem_file.name for item in FILE_ENTRIES})
    assert files == entries
    assert set(SMALL_SIZES) == {item.problem_file.stem for item in FILE_ENTRIES}
    assert len({item.name for item in SUITE}) == len(SUITE), "entry names repeat"


@pytest.mark.parametrize("item", FILE_ENTRIES, ids=lambda item: item.name)
def test_problem_file_is_documented_and_unseeded(item):
    source = item.problem_file.read_text()
    assert ast.get_docstring(ast.parse(source)), f"{item.name} has no module docstring"
    assert "manual_seed" not in source, f"{item.name} seeds itself; Kiln's loader seeds"


@pytest.mark.parametrize("item", FILE_ENTRIES, ids=lambda e: e.name)
def test_problem_has_sites_of_its_families(item, tmp_path):
    assert_families(item, site_signatures(str(shrunk_copy(item, tmp_path)), item.dtype))


@pytest.mark.parametrize("item", FILE_ENTRIES, ids=lambda item: item.name)
def test_problem_at_full_size_is_worth_timing(item):
    module = import_file(item.problem_file, f"bench_problem_{item.name}")
    dtype = DTYPES[item.dtype]
    with torch.device("meta"):  # shapes and FLOPs without allocating gigabytes
        model = module.Model(*module.get_init_inputs()).to(dtype)
        inputs = [x.to(dtype) for x in module.get_inputs()]
        with FlopCounterMode(display=False) as counter:
            outputs = tree_flatten(model(*inputs))[0]
    tensors = [*inputs, *model.parameters(), *outputs]
    traffic = sum(t.numel() * t.element_size() for t in tensors)
    floor_s = max(traffic / GpuPeaks().bandwidth,
                  counter.get_total_flops() / GpuPeaks().matrix_peak(dtype))
    assert floor_s >= MIN_FLOOR_S, (
        f"{item.name} at full size: {traffic / 2**20:.1f} MiB, "
        f"{counter.get_total_flops() / 1e9:.1f} GFLOP, floor {floor_s * 1e6:.1f} µs on an H200")


def test_gpt2_entry_is_gpt2_small():
    item = entry("gpt2")
    loaded = load_model(item.model, CPU, shape=BuiltinShape(batch=1, seq_len=8))
    config = loaded.model.config
    assert (config.n_layer, config.n_embd, config.n_head) == (12, 768, 12)
    assert sum(p.numel() for p in loaded.model.parameters()) == 124_439_808


def test_gpt2_has_sites_of_its_families():
    item = entry("gpt2")
    model_type = item.model.partition("?")[0]
    tiny = f"{model_type}?n_layer=1&n_embd=64&n_head=4&vocab_size=128&n_positions=32"
    signatures = site_signatures(tiny, item.dtype, BuiltinShape(batch=1, seq_len=16))
    assert_families(item, signatures)


@pytest.mark.parametrize("name", ["resnet50", "vit_b_16"])
def test_torchvision_entry_loads(name):
    pytest.importorskip("torchvision", reason="torchvision entries need kiln[vision]")
    item = entry(name)
    shape = BuiltinShape(batch=1, image_size=item.shape.image_size)
    loaded = load_model(item.model, CPU, shape=shape)
    output = check_runs(loaded, None)
    assert output.shape == (1, 1000)


def test_entry_finds_by_name_and_names_the_choices_when_missing():
    assert entry("layer_norm").problem_file == PROBLEMS / "layer_norm.py"
    with pytest.raises(KilnInputError) as raised:
        entry("layernorm")
    assert "'layernorm'" in raised.value.problem and "layer_norm" in raised.value.fix


@pytest.mark.parametrize(
    ("model", "dtype", "expects", "shape", "message"),
    [
        ("x.py", "fp8", ("matmul",), None, "dtype 'fp8'"),
        ("x.py", "fp32", (), None, "must name families"),
        ("x.py", "fp32", ("gemm",), None, "must name families"),
        ("x.py", "fp32", ("matmul",), BuiltinShape(), "built-in models and only them"),
        ("hf:gpt2", "fp32", ("matmul",), None, "built-in models and only them"),
    ],
)
def test_malformed_entries_are_refused(model, dtype, expects, shape, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        SuiteEntry("bad", model, dtype, expects, shape)
