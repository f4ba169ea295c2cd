"""Turning a MODEL spec into a module and example inputs on the chosen device and dtype.

Specs:
- a KernelBench-format file (`Model`, `get_inputs`, `get_init_inputs`), built seeded;
- `package.module:callable`, a function returning `(model, example_inputs)`;
- `torchvision:<name>` and `hf:<model_type>[?key=value&...]`, built from their configs with
  random weights (nothing is downloaded).
"""

from __future__ import annotations

import importlib
import importlib.util
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from urllib.parse import parse_qsl

import torch
import torch.nn as nn
from torch.utils._pytree import tree_flatten, tree_map

from core.runtime.errors import KilnInputError
from core.runtime.problem_loader import seed_device

DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


@dataclass(frozen=True)
class BuiltinShape:
    """Example-input sizes for built-in models (files and callables bring their own)."""

    batch: int = 1
    seq_len: int = 128
    image_size: int = 224


@dataclass
class LoadedModel:
    spec: str
    name: str  # a short slug for folders and reports
    model: nn.Module
    inputs: tuple
    device: torch.device

    def move_inputs(self, device: torch.device | str) -> None:
        """Move the example inputs: a run parks them in host memory while its search needs the
        GPU, and brings them back for the end-to-end check."""
        self.inputs = _cast(self.inputs, torch.device(device), None)


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", text).strip("-") or "model"


def import_file(path: Path, module_name: str) -> ModuleType:
    """Import a Python file as a fresh module; errors name the file."""
    if not path.is_file():
        raise KilnInputError(f"no such file: {path}", "give the path of a Python file")
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        raise KilnInputError(f"{path} is not an importable Python file", "use a .py file")
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except Exception as err:
        raise KilnInputError(
            f"importing {path} raised {type(err).__name__}: {err}",
            "make the file importable on its own (python " + str(path) + ")",
        ) from err
    return module


def _from_kernelbench_file(path: Path, seed: int, device: torch.device
                           ) -> tuple[nn.Module, tuple]:
    """The file's `Model` (built on the CPU, as KernelBench builds it) and its inputs, drawn on
    `device` as the judge draws them: a problem's inputs can be gigabytes, made where they
    are used rather than drawn by the CPU and copied."""
    module = import_file(path, f"kiln_model_{_slug(path.stem).replace('-', '_')}")
    missing = [n for n in ("Model", "get_inputs") if not hasattr(module, n)]
    if missing:
        raise KilnInputError(
            f"{path} has no {' or '.join(missing)}: it is not a KernelBench-format file",
            "define class Model(nn.Module), get_inputs() and get_init_inputs(), "
            "or pass package.module:callable returning (model, inputs)",
        )
    get_init = getattr(module, "get_init_inputs", lambda: [])
    try:
        torch.manual_seed(seed)
        model = module.Model(*get_init())
        seed_device(seed, device)
        with torch.device(device):
            inputs = tuple(module.get_inputs())
    except Exception as err:
        raise KilnInputError(
            f"building the model from {path} raised {type(err).__name__}: {err}",
            "check that Model(*get_init_inputs()) and get_inputs() run",
        ) from err
    return model, inputs


def _from_callable(spec: str, seed: int) -> tuple[nn.Module, tuple]:
    module_name, _, attr = spec.partition(":")
    if str(Path.cwd()) not in sys.path:
        sys.path.insert(0, str(Path.cwd()))
    try:
        module = importlib.import_module(module_name)
    except Exception as err:
        raise KilnInputError(
            f"cannot import {module_name!r} for {spec!r}: {type(err).__name__}: {err}",
            "run from the folder that holds the package, or install it",
        ) from err
    factory = getattr(module, attr, None)
    if not callable(factory):
        raise KilnInputError(f"{module_name} has no callable {attr!r}",
                             "name a function that returns (model, example_inputs)")
    try:
        torch.manual_seed(seed)
        result = factory()
    except Exception as err:
        raise KilnInputError(
            f"{spec}() raised {type(err).__name__}: {err}",
            "make the function run on its own and return (model, example_inputs)",
        ) from err
    if not (isinstance(result, tuple) and len(result) == 2 and isinstance(result[0], nn.Module)):
        raise KilnInputError(f"{spec}() returned {type(result).__name__}, not (model, inputs)",
                             "return a tuple (nn.Module, example_inputs)")
    model, inputs = result
    if isinstance(inputs, torch.Tensor):
        inputs = (inputs,)
    return model, tuple(inputs)


def _from_torchvision(name: str, shape: BuiltinShape) -> tuple[nn.Module, tuple]:
    try:
        import torchvision
    except ImportError as err:
        raise KilnInputError(
            f"torchvision:{name} needs torchvision, which does not import here ({err})",
            "pip install 'kiln[vision]' (torchvision matching your torch)",
        ) from err
    available = torchvision.models.list_models()
    if name not in available:
        raise KilnInputError(f"torchvision has no model {name!r}",
                             f"pick one of: {', '.join(sorted(available)[:12])}, ...")
    try:
        model = torchvision.models.get_model(name, weights=None)
    except Exception as err:
        raise KilnInputError(f"building torchvision:{name} raised {type(err).__name__}: {err}",
                             "pick another torchvision model, or check torchvision's version "
                             "against torch's") from err
    size = shape.image_size
    return model, (torch.randn(shape.batch, 3, size, size),)


def _from_huggingface(text: str, shape: BuiltinShape) -> tuple[nn.Module, tuple]:
    try:
        import transformers
    except ImportError as err:
        raise KilnInputError(f"hf:{text} needs transformers, which does not import ({err})",
                             "pip install 'kiln[hf]'") from err
    model_type, _, query = text.partition("?")
    if model_type not in transformers.CONFIG_MAPPING:
        raise KilnInputError(f"transformers has no model type {model_type!r}",
                             "use a model_type such as gpt2, bert, llama, vit")
    overrides = {key: _literal(value) for key, value in parse_qsl(query)}
    try:
        config = transformers.AutoConfig.for_model(model_type, **overrides)
        if hasattr(config, "use_cache"):
            config.use_cache = False
        mapping = transformers.models.auto.modeling_auto.MODEL_FOR_CAUSAL_LM_MAPPING
        auto = (transformers.AutoModelForCausalLM if type(config) in mapping
                else transformers.AutoModel)
        model = auto.from_config(config)
    except Exception as err:
        given = ", ".join(f"{key}={value}" for key, value in overrides.items()) or "defaults"
        raise KilnInputError(
            f"building hf:{model_type} from its config ({given}) raised "
            f"{type(err).__name__}: {err}",
            "change the key=value overrides in the spec so that the config holds together"
            ) from err
    if model.main_input_name == "input_ids":
        ids = torch.randint(0, config.vocab_size, (shape.batch, shape.seq_len))
        return model, (ids,)
    if model.main_input_name == "pixel_values":
        size = getattr(config, "image_size", shape.image_size)
        channels = getattr(config, "num_channels", 3)
        return model, (torch.randn(shape.batch, channels, size, size),)
    raise KilnInputError(f"hf:{model_type} takes {model.main_input_name!r}, which Kiln cannot draw",
                         "wrap the model in a function returning (model, inputs)")


def _literal(value: str) -> object:
    for convert in (int, float):
        try:
            return convert(value)
        except ValueError:
            pass
    return {"true": True, "false": False}.get(value.lower(), value)


def _cast(inputs: tuple, device: torch.device, dtype: torch.dtype | None) -> tuple:
    def move(x: object) -> object:
        if not isinstance(x, torch.Tensor):
            return x
        x = x.to(device)
        return x.to(dtype) if dtype is not None and x.is_floating_point() else x

    return tree_map(move, inputs)


def resolve_device(name: str) -> torch.device:
    if name == "cuda" and not torch.cuda.is_available():
        raise KilnInputError("--device cuda was asked for but no CUDA GPU is visible",
                             "run on a machine with an NVIDIA GPU, or pass --device cpu")
    if name not in ("cuda", "cpu"):
        raise KilnInputError(f"unknown device {name!r}", "pass --device cuda or --device cpu")
    return torch.device(name)


def load_model(spec: str, device: torch.device, dtype: str | None = None, seed: int = 0,
               shape: BuiltinShape = BuiltinShape()) -> LoadedModel:
    """Build the model named by `spec` in eval mode on `device`, cast to `dtype` if given."""
    if dtype is not None and dtype not in DTYPES:
        raise KilnInputError(f"unknown dtype {dtype!r}", f"pass one of {', '.join(DTYPES)}")
    if spec.startswith("torchvision:"):
        model, inputs = _from_torchvision(spec.split(":", 1)[1], shape)
    elif spec.startswith("hf:"):
        model, inputs = _from_huggingface(spec.split(":", 1)[1], shape)
    elif spec.endswith(".py") or Path(spec).exists():
        model, inputs = _from_kernelbench_file(Path(spec), seed, device)
    elif re.fullmatch(r"[A-Za-z_][\w.]*:[A-Za-z_]\w*", spec):
        model, inputs = _from_callable(spec, seed)
    else:
        raise KilnInputError(
            f"cannot read the model spec {spec!r}",
            "give a KernelBench .py file, package.module:callable, torchvision:<name> "
            "or hf:<model_type>",
        )
    torch_dtype = DTYPES[dtype] if dtype is not None else None
    model = model.to(device=device, dtype=torch_dtype).eval()
    return LoadedModel(spec, _slug(Path(spec).stem if spec.endswith(".py") else spec),
                       model, _cast(inputs, device, torch_dtype), device)


def check_runs(loaded: LoadedModel, dtype: str | None) -> object:
    """Run the model once eagerly; a failure or an output with no tensor is the user's to fix."""
    try:
        with torch.no_grad():
            output = loaded.model(*loaded.inputs)
    except Exception as err:
        cast = f" under --dtype {dtype}" if dtype else ""
        fix = ("run without --dtype or with --dtype fp32, or on a device that supports it"
               if dtype else "check that the model runs eagerly on its example inputs")
        raise KilnInputError(
            f"the model raised {type(err).__name__}{cast} on {loaded.device.type}: {err}", fix
        ) from err
    if not any(isinstance(x, torch.Tensor) for x in tree_flatten(output)[0]):
        raise KilnInputError(
            f"the model returned {type(output).__name__} with no tensor in it",
            "return the tensors to optimize from forward()",
        )
    return output
