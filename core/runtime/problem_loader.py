"""Load KernelBench-format problem files and `ModelNew` candidate sources into Python modules.

A problem defines `Model`, `get_inputs()` and `get_init_inputs()`; a site problem may keep the
real captured inputs in `inputs.pt` beside it. Candidates are written to a file before import
because `@triton.jit` reads a kernel's source back through `inspect`.
"""

from __future__ import annotations

import ast
import hashlib
import importlib.util
import sys
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import torch

from .errors import KilnInputError
from .python_ast import parse

CAPTURED_INPUTS_FILE = "inputs.pt"
PROBLEM_NAMES = ("Model", "get_inputs", "get_init_inputs")


@dataclass
class Problem:
    path: Path
    module: ModuleType
    captured_inputs: list[torch.Tensor] | None

    @property
    def model_class(self) -> type[torch.nn.Module]:
        return self.module.Model

    def init_inputs(self) -> list:
        return list(self.module.get_init_inputs())

    def inputs(self, seed: int, device: torch.device | str = "cpu") -> list:
        """`get_inputs()` after `seed`, its tensors made on `device` (drawn there, not copied:
        inputs can be gigabytes)."""
        seed_device(seed, torch.device(device))
        with torch.device(device):
            values = list(self.module.get_inputs())
        return on_device(values, torch.device(device))


def seed_device(seed: int, device: torch.device) -> None:
    """Seed the CPU's generator and, for a GPU, the GPU's: what drawing on `device` reads.
    (`torch.manual_seed` also queues seeds for devices not started, recording a stack trace
    for each, a millisecond a call.)"""
    torch.random.default_generator.manual_seed(seed)
    if device.type == "cuda":
        torch.cuda.manual_seed_all(seed)


def on_device(values: list[object], device: torch.device) -> list[object]:
    """`values` with each tensor moved to `device`, other values as they are."""
    return [t.to(device) if isinstance(t, torch.Tensor) else t for t in values]


def read_source(path: str | Path, what: str) -> str:
    path = Path(path)
    try:
        return path.read_text()
    except (OSError, UnicodeDecodeError) as err:
        raise KilnInputError(
            f"cannot read the {what} file {path}: {err}",
            f"pass the path of a readable Python file defining the {what}",
        ) from err


def defined_names(source: str) -> set[str]:
    """Top-level names a module source defines (classes, functions, assignments, imports)."""
    names: set[str] = set()
    for node in parse(source).body:
        if isinstance(node, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.Import | ast.ImportFrom):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
    return names


def check_problem_source(source: str, path: Path) -> None:
    try:
        names = defined_names(source)
    except SyntaxError as err:
        raise KilnInputError(
            f"the problem file {path} is not valid Python: line {err.lineno}: {err.msg}",
            "fix the syntax error in the problem file",
        ) from err
    missing = [name for name in PROBLEM_NAMES if name not in names]
    if missing:
        raise KilnInputError(
            f"the problem file {path} does not define {', '.join(missing)}",
            "a problem is a KernelBench-format file: class Model(nn.Module), get_inputs(), "
            "get_init_inputs()",
        )


def check_candidate_source(source: str, path: str | Path) -> None:
    """Bad input for the CLI: a candidate that parses but defines no `ModelNew`.

    A candidate with a syntax error is not bad input: it is a candidate that does not compile.
    """
    try:
        names = defined_names(source)
    except SyntaxError:
        return
    if "ModelNew" not in names:
        raise KilnInputError(
            f"the candidate file {path} does not define ModelNew",
            "a candidate is a module defining class ModelNew(nn.Module) with Model's forward "
            "signature",
        )


def import_file(path: Path, module_name: str) -> ModuleType:
    """Import a Python file as a fresh module named `module_name` (replacing any earlier one)."""
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(module_name, None)
        raise
    return module


def storage_span(tensor: torch.Tensor) -> tuple[int, int]:
    """The first byte of the tensor's storage it can reach, and how many bytes it reaches."""
    size = tensor.element_size()
    if tensor.numel() == 0:
        return tensor.storage_offset() * size, 0
    last = sum((n - 1) * s for n, s in zip(tensor.shape, tensor.stride(), strict=True))
    return tensor.storage_offset() * size, (last + 1) * size


def with_layout(tensor: torch.Tensor) -> torch.Tensor:
    """A CPU copy of a captured input keeping its strides: the stretch of storage it reaches, in
    a storage of its own. A clone of a strided view (a column of a matrix) is compact, and a
    kernel written for the site's strides refuses it."""
    tensor = tensor.detach()
    _, span = storage_span(tensor)
    if span == 0:
        return tensor.clone().cpu()
    reached = torch.as_strided(tensor, (span // tensor.element_size(),), (1,),
                               tensor.storage_offset())
    return reached.clone().cpu().as_strided(tensor.shape, tensor.stride())


def load_captured_inputs(problem_path: Path) -> list[torch.Tensor] | None:
    captured = problem_path.parent / CAPTURED_INPUTS_FILE
    if not captured.exists():
        return None
    try:
        tensors = torch.load(captured, weights_only=True)
    except Exception as err:
        raise KilnInputError(
            f"cannot load the captured inputs {captured}: {err}",
            "save them with torch.save(list_of_cpu_tensors, path) or delete the file",
        ) from err
    if not isinstance(tensors, list | tuple):
        raise KilnInputError(
            f"the captured inputs {captured} hold a {type(tensors).__name__}, not a list",
            "save the forward arguments as a list, in forward's argument order",
        )
    return list(tensors)


def load_problem(path: str | Path, captured: bool = True) -> Problem:
    """The problem at `path`; `captured`: with the inputs captured beside it, if any."""
    path = Path(path).resolve()
    source = read_source(path, "problem")
    check_problem_source(source, path)
    digest = hashlib.sha256(source.encode()).hexdigest()[:16]
    try:
        module = import_file(path, f"kiln_problem_{digest}")
    except Exception as err:
        raise KilnInputError(
            f"the problem file {path} fails on import: {type(err).__name__}: {err}",
            "make the problem file importable on its own",
        ) from err
    return Problem(path=path, module=module,
                   captured_inputs=load_captured_inputs(path) if captured else None)


def write_candidate(source: str, directory: Path) -> tuple[Path, str]:
    """Write a candidate source under `directory`; returns its path and a unique module name."""
    digest = hashlib.sha256(source.encode()).hexdigest()[:16]
    name = f"kiln_candidate_{digest}"
    path = directory / f"{name}.py"
    if not path.exists():
        path.write_text(source)
    return path, name
