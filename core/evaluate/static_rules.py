"""Rules a candidate source must pass before it is run, read from its syntax tree.

A candidate may import only torch, triton, pycuda, numpy, a few pure standard modules and Kiln's
CUDA runtime helper; it must define a custom kernel (a `@triton.jit` function, or CUDA C++ with a
`__global__` function handed to pycuda); it may not catch exceptions, keep state in globals,
monkey-patch modules, touch streams, events, graphs, RNG seeds, files, threads, timers, network
or subprocesses, or compute with torch beyond the site's anchor op (matmul or conv).
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field

from core.runtime.python_ast import parse

ALLOWED_IMPORT_ROOTS = frozenset(
    {"torch", "triton", "pycuda", "numpy", "math", "typing", "functools", "operator",
     "itertools", "__future__", "cuda_runtime"}
)
# The CUDA launcher, under its name and the one earlier stored candidates import.
CUDA_LOADER_MODULES = ("core.runtime.cuda", "core.cuda_runtime")

# Dotted prefixes that change how work is scheduled, timed, seeded or compiled, or reach the
# file system: each is a way a candidate has fooled a timer or a check.
BANNED_PREFIXES: dict[str, str] = {
    "torch.cuda.Stream": "streams",
    "torch.cuda.stream": "streams",
    "torch.cuda.set_stream": "streams",
    "torch.cuda.ExternalStream": "streams",
    "torch.cuda.current_stream": "streams",
    "torch.cuda.default_stream": "streams",
    "torch.cuda.streams": "streams",
    "torch.Stream": "streams",
    "torch.cuda.Event": "timers",
    "torch.Event": "timers",
    "torch.cuda.graph": "CUDA graphs",
    "torch.cuda.CUDAGraph": "CUDA graphs",
    "torch.cuda.memory": "the caching allocator",
    "torch.cuda.empty_cache": "the caching allocator",
    "torch.cuda.manual_seed": "RNG seeding",
    "torch.manual_seed": "RNG seeding",
    "torch.seed": "RNG seeding",
    "torch.random": "RNG seeding",
    "torch.set_rng_state": "RNG seeding",
    "torch.save": "file I/O",
    "torch.load": "file I/O",
    "torch.from_file": "file I/O",
    "torch.hub": "network",
    "torch.compile": "other compilers",
    "torch.jit": "other compilers",
    "torch._dynamo": "other compilers",
    "torch._inductor": "other compilers",
    "torch.utils": "torch internals",
    "torch._C": "torch internals",
    "torch.library": "torch internals",
    "torch.backends": "global numeric flags",
    "torch.set_float32_matmul_precision": "global numeric flags",
    "torch.use_deterministic_algorithms": "global numeric flags",
    "torch.set_default_dtype": "global numeric flags",
    "torch.set_default_device": "global numeric flags",
    "torch.multiprocessing": "subprocesses",
    "torch.distributed": "network",
    "triton.testing": "timers",
    "triton.runtime": "the Triton runtime",
    "triton.knobs": "the Triton runtime",
    "pycuda.autoinit": "a second CUDA context",
    "pycuda.driver.Stream": "streams",
    "pycuda.driver.Event": "timers",
    "pycuda.driver.Context": "a second CUDA context",
    "pycuda.driver.Device": "a second CUDA context",
}
BANNED_ATTRIBUTES = frozenset(
    {"record_stream", "wait_stream", "wait_event", "elapsed_time", "__dict__", "__class__",
     "__globals__", "__code__", "__closure__", "__builtins__", "__subclasses__", "__bases__",
     "__mro__", "__getattribute__", "__setattr__", "f_globals", "f_locals", "f_back", "gi_frame"}
)
BANNED_BUILTINS = frozenset(
    {"open", "exec", "eval", "compile", "__import__", "globals", "locals", "vars", "getattr",
     "setattr", "delattr", "input", "breakpoint", "memoryview"}
)
CACHING_DECORATORS = frozenset(
    {"functools.cache", "functools.lru_cache", "functools.cached_property"}
)
KERNEL_DECORATORS = frozenset({"triton.jit", "triton.autotune", "triton.heuristics"})

# Torch calls that only allocate or rearrange memory; any other torch call is compute.
ALLOCATION_CALLS = frozenset(
    {"empty", "empty_like", "empty_strided", "zeros", "zeros_like", "ones", "ones_like", "full",
     "full_like", "tensor", "as_tensor", "reshape", "flatten", "transpose", "permute", "t",
     "squeeze", "unsqueeze", "broadcast_to", "is_tensor", "finfo", "iinfo", "no_grad",
     "inference_mode", "Size", "device", "dtype", "float32", "float16", "bfloat16"}
)
ANCHOR_CALLS: dict[str, str] = {
    "torch.nn.functional.linear": "matmul",
    "torch.matmul": "matmul",
    "torch.mm": "matmul",
    "torch.bmm": "matmul",
    "torch.addmm": "matmul",
    "torch.baddbmm": "matmul",
    "torch.nn.functional.conv1d": "conv",
    "torch.nn.functional.conv2d": "conv",
    "torch.nn.functional.conv3d": "conv",
    "torch.nn.functional.conv_transpose1d": "conv",
    "torch.nn.functional.conv_transpose2d": "conv",
    "torch.nn.functional.conv_transpose3d": "conv",
}
ANCHOR_NAMES: dict[str, str] = {
    "linear": "matmul", "matmul": "matmul", "mm": "matmul", "bmm": "matmul", "addmm": "matmul",
    "baddbmm": "matmul", "Linear": "matmul", "Bilinear": "matmul", "einsum": "matmul",
    "conv1d": "conv", "conv2d": "conv", "conv3d": "conv", "conv_transpose1d": "conv",
    "conv_transpose2d": "conv", "conv_transpose3d": "conv", "Conv1d": "conv", "Conv2d": "conv",
    "Conv3d": "conv", "ConvTranspose1d": "conv", "ConvTranspose2d": "conv",
    "ConvTranspose3d": "conv",
}


@dataclass
class StaticReport:
    tier: str = ""
    violations: list[str] = field(default_factory=list)
    library_ops: list[str] = field(default_factory=list)
    cuda_sources: list[tuple[int, str]] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.violations


def problem_anchors(problem_source: str) -> set[str]:
    """Anchor families ("matmul", "conv") the problem computes: those a library may do."""
    anchors: set[str] = set()
    for node in ast.walk(parse(problem_source)):
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.MatMult):
            anchors.add("matmul")
        name = node.attr if isinstance(node, ast.Attribute) else getattr(node, "id", None)
        if isinstance(node, ast.Attribute | ast.Name) and name in ANCHOR_NAMES:
            anchors.add(ANCHOR_NAMES[name])
    return anchors


def import_aliases(tree: ast.Module) -> dict[str, str]:
    """Local name → full dotted name, for every import in the module."""
    aliases: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname:
                    aliases[alias.asname] = alias.name
                else:
                    root = alias.name.split(".")[0]
                    aliases[root] = root
        elif isinstance(node, ast.ImportFrom) and node.module:
            for alias in node.names:
                aliases[alias.asname or alias.name] = f"{node.module}.{alias.name}"
    return aliases


def dotted_name(node: ast.AST, aliases: dict[str, str]) -> str | None:
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name) or node.id not in aliases:
        return None
    return ".".join([aliases[node.id], *reversed(parts)])


def banned_category(name: str) -> str | None:
    for prefix, category in BANNED_PREFIXES.items():
        if name == prefix or name.startswith(prefix + "."):
            return category
    return None


class _Checker(ast.NodeVisitor):
    def __init__(self, tree: ast.Module, anchors: set[str]) -> None:
        self.aliases = import_aliases(tree)
        self.anchors = anchors
        self.report = StaticReport()
        self.has_triton_kernel = False
        self.uses_cuda_loader = False

    def flag(self, node: ast.AST, message: str) -> None:
        self.report.violations.append(f"line {getattr(node, 'lineno', '?')}: {message}")

    def check_module_name(self, node: ast.AST, module: str) -> None:
        root = module.split(".")[0]
        if any(module == m or module.startswith(m + ".") for m in CUDA_LOADER_MODULES):
            self.uses_cuda_loader = True
            return
        if root == "cuda_runtime":
            self.uses_cuda_loader = True
        if root not in ALLOWED_IMPORT_ROOTS:
            self.flag(node, f"imports {module}: a candidate may import only "
                            f"{', '.join(sorted(ALLOWED_IMPORT_ROOTS))} and core.runtime.cuda")
            return
        category = banned_category(module)
        if category:
            self.flag(node, f"imports {module}: candidates may not touch {category}")

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            self.check_module_name(node, alias.name)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if node.level:
            self.flag(node, "relative import: a candidate must be a self-contained module")
            return
        module = node.module or ""
        self.check_module_name(node, module)
        for alias in node.names:
            full = f"{module}.{alias.name}"
            if alias.name == "*":
                self.flag(node, f"star import from {module}: import names explicitly")
            elif banned_category(full):
                self.flag(node, f"imports {full}: candidates may not touch {banned_category(full)}")
            if full == "pycuda.compiler.SourceModule":
                self.uses_cuda_loader = True

    def visit_Try(self, node: ast.Try) -> None:
        if node.handlers:
            self.flag(node, "catches exceptions: a candidate must fail loudly, not fall back")
        self.generic_visit(node)

    visit_TryStar = visit_Try

    def visit_Global(self, node: ast.Global) -> None:
        self.flag(node, "declares globals: a candidate may not keep state across calls")

    def visit_Nonlocal(self, node: ast.Nonlocal) -> None:
        self.flag(node, "declares nonlocals: a candidate may not keep state across calls")

    def visit_Attribute(self, node: ast.Attribute) -> None:
        if node.attr in BANNED_ATTRIBUTES:
            self.flag(node, f"uses .{node.attr}: streams, events and interpreter internals are "
                            "off limits")
        name = dotted_name(node, self.aliases)
        if name:
            category = banned_category(name)
            if category:
                self.flag(node, f"uses {name}: candidates may not touch {category}")
            if name.startswith(("pycuda.compiler.SourceModule", "cuda_runtime",
                                *CUDA_LOADER_MODULES)):
                self.uses_cuda_loader = True
        if isinstance(node.ctx, ast.Store | ast.Del):
            base = node.value
            if isinstance(base, ast.Attribute | ast.Name) and dotted_name(base, self.aliases):
                self.flag(node, f"assigns to {dotted_name(node, self.aliases)}: candidates may "
                                "not monkey-patch modules")
            return
        self.generic_visit(node)

    def visit_Name(self, node: ast.Name) -> None:
        if node.id in BANNED_BUILTINS:
            self.flag(node, f"uses {node.id}(): file I/O, dynamic code and reflection are off "
                            "limits")
        name = self.aliases.get(node.id)
        if name == "pycuda.compiler.SourceModule":
            self.uses_cuda_loader = True

    def visit_FunctionDef(self, node: ast.FunctionDef) -> None:
        for decorator in node.decorator_list:
            target = decorator.func if isinstance(decorator, ast.Call) else decorator
            name = dotted_name(target, self.aliases) or ""
            if name in KERNEL_DECORATORS:
                self.has_triton_kernel = True
            if name in CACHING_DECORATORS:
                self.flag(decorator, f"uses @{name}: a candidate may not cache results")
        self.generic_visit(node)

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_Call(self, node: ast.Call) -> None:
        name = dotted_name(node.func, self.aliases) or ""
        if name.startswith("torch.") and not banned_category(name):
            self.check_torch_call(node, name)
        self.generic_visit(node)

    def check_torch_call(self, node: ast.Call, name: str) -> None:
        family = ANCHOR_CALLS.get(name)
        if family:
            if family in self.anchors:
                self.report.library_ops.append(name)
            else:
                self.flag(node, f"calls {name}: a library {family} is allowed only on a "
                                f"{family} site, and this site has none")
            return
        leaf = name.rsplit(".", 1)[-1]
        namespace = name.rsplit(".", 1)[0]
        is_compute_namespace = namespace in ("torch", "torch.nn.functional", "torch.special",
                                             "torch.linalg", "torch.fft")
        if is_compute_namespace and leaf not in ALLOCATION_CALLS:
            self.flag(node, f"calls {name}: the site's compute must be done by the candidate's "
                            "own kernels")

    def visit_Constant(self, node: ast.Constant) -> None:
        if isinstance(node.value, str) and "__global__" in node.value:
            self.report.cuda_sources.append((node.lineno, node.value))


def check_candidate(candidate_source: str, problem_source: str) -> StaticReport:
    """Apply every static rule; raises SyntaxError when the candidate does not parse."""
    tree = parse(candidate_source)
    checker = _Checker(tree, problem_anchors(problem_source))
    checker.visit(tree)
    report = checker.report
    if checker.has_triton_kernel:
        report.tier = "triton"
    if report.cuda_sources and checker.uses_cuda_loader:
        report.tier = "cuda" if not report.tier else "triton+cuda"
    if not report.tier:
        report.violations.append(
            "no custom kernel: define a @triton.jit kernel, or CUDA C++ with a __global__ "
            "function loaded through pycuda or core.runtime.cuda"
        )
    return report
