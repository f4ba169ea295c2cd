"""Kiln's benchmark suite: the models a benchmark run optimizes, each with its dtype and the
site families its site table must contain.

Problem files live in `bench/problems/` (KernelBench format, sizes for an H200); whole models are
built from their configs with random weights (nothing is downloaded). Each entry's `model` is a spec
`core.profile.load.load_model` accepts, `dtype` is passed as `--dtype`, and `shape` (built-in models
only) sets `--batch`, `--seq-len` and `--image-size`:

    from bench.suite import SUITE, entry
    for item in SUITE:
        list_sites(ListSitesConfig(model=item.model, device="cuda", dtype=item.dtype,
                                   shape=item.shape or BuiltinShape()))
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from core.profile.load import DTYPES, BuiltinShape
from core.runtime.errors import KilnInputError
from core.runtime.partition import FAMILY_OF_KIND

PROBLEMS = Path(__file__).resolve().parent / "problems"
DEV_PROBLEMS = Path(__file__).resolve().parent / "kernelbench_dev"
FAMILIES = frozenset(FAMILY_OF_KIND.values())
_BUILTIN_PREFIXES = ("torchvision:", "hf:")


@dataclass(frozen=True)
class SuiteEntry:
    name: str
    model: str  # a problem file's absolute path, or a built-in spec (torchvision:..., hf:...)
    dtype: str  # a key of core.profile.load.DTYPES
    # Site families the model's site table must contain; none asserted for the development
    # set's problems, which are taken as written.
    expects: tuple[str, ...]
    shape: BuiltinShape | None = None  # built-in models only: files bring their own sizes

    def __post_init__(self) -> None:
        if self.dtype not in DTYPES:
            raise ValueError(f"{self.name}: dtype {self.dtype!r} is not one of {list(DTYPES)}")
        unknown = set(self.expects) - FAMILIES
        as_written = Path(self.model).parent.parent == DEV_PROBLEMS
        if (not self.expects and not as_written) or unknown:
            raise ValueError(f"{self.name}: expects {self.expects} must name families among "
                             f"{sorted(FAMILIES)}")
        if self.is_builtin != (self.shape is not None):
            raise ValueError(f"{self.name}: a shape is given for built-in models and only them")

    @property
    def is_builtin(self) -> bool:
        return self.model.startswith(_BUILTIN_PREFIXES)

    @property
    def problem_file(self) -> Path | None:
        return None if self.is_builtin else Path(self.model)


def _problem(name: str, dtype: str, *expects: str, file: str = "") -> SuiteEntry:
    """The problem file `file` (default: `name`) in `dtype`: one file may run in two dtypes."""
    return SuiteEntry(name, str(PROBLEMS / f"{file or name}.py"), dtype, expects)


# bf16 where tensor cores do the work (matmul, conv, attention), fp32 for memory-bound
# problems, whose traffic the problem sizes were chosen for.
SUITE: list[SuiteEntry] = [
    _problem("linear_bias_gelu", "bf16", "matmul"),
    _problem("linear_residual_layernorm", "bf16", "matmul", "reduction"),
    _problem("bmm_softcap", "bf16", "matmul"),
    _problem("gated_mlp", "bf16", "matmul"),
    _problem("conv_bias_relu_scale", "bf16", "conv"),
    _problem("conv_groupnorm_silu", "bf16", "conv"),
    _problem("depthwise_conv_block", "bf16", "conv"),
    _problem("layer_norm", "fp32", "reduction"),
    _problem("rms_norm", "fp32", "reduction"),
    _problem("group_norm", "fp32", "reduction"),
    _problem("batch_norm", "fp32", "reduction"),
    _problem("softmax", "fp32", "reduction"),
    _problem("log_softmax", "fp32", "reduction"),
    _problem("softmax_dim1", "fp32", "reduction"),
    _problem("sum_dim1", "fp32", "reduction"),
    _problem("mean_dims", "fp32", "reduction"),
    _problem("amax_dim0", "fp32", "reduction"),
    _problem("sdpa_causal", "bf16", "attention"),
    _problem("manual_attention", "bf16", "attention"),
    # Attention as GPT-2 small writes it out (matmuls and masked_fill), in both dtypes.
    _problem("causal_attention", "bf16", "attention"),
    _problem("causal_attention_fp32", "fp32", "attention", file="causal_attention"),
    _problem("swish_bias", "fp32", "pointwise"),
    _problem("gelu_tanh", "fp32", "pointwise"),
    # Both norms feed only a projection: each is that matmul site's prologue.
    _problem("transformer_block", "bf16", "matmul", "attention"),
    SuiteEntry("resnet50", "torchvision:resnet50", "bf16", ("conv", "matmul"),
               BuiltinShape(batch=32, image_size=224)),
    SuiteEntry("gpt2", "hf:gpt2?n_layer=12&n_embd=768&n_head=12", "bf16",
               ("matmul", "reduction", "attention"), BuiltinShape(batch=8, seq_len=1024)),
    SuiteEntry("vit_b_16", "torchvision:vit_b_16", "bf16", ("conv", "matmul", "reduction"),
               BuiltinShape(batch=32, image_size=224)),
]




def _dev_entry(path: Path) -> SuiteEntry:
    return SuiteEntry(f"l{path.parent.name.removeprefix('level')}_{path.stem}", str(path),
                      "fp32", ())


# The development set: KernelBench problems at KernelBench's own sizes, fp32, as written
# (bench/kernelbench_dev/README.md says where they come from).
DEV_SUITE: list[SuiteEntry] = [_dev_entry(path) for path in sorted(
    DEV_PROBLEMS.glob("level*/*.py"),
    key=lambda path: (path.parent.name, int(path.stem.split("_")[0])))]
SETS = {"suite": SUITE, "dev": DEV_SUITE}


def entry(name: str) -> SuiteEntry:
    """The entry called `name`, of the suite or the development set."""
    for item in SUITE + DEV_SUITE:
        if item.name == name:
            return item
    raise KilnInputError(f"the benchmark suite has no entry {name!r}",
                         f"pick one of: {', '.join(item.name for item in SUITE + DEV_SUITE)}")
