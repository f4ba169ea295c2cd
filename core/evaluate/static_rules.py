"""Rules a candidate source must pass before it is run, read from its syntax tree.

The rules are an allowlist (`core.evaluate.allowlist`): a candidate may import and name only
what the allowlist holds, uses modules only as the roots of dotted paths (never as values it
could hand on, so every path is seen here), uses only its own names and a few plain builtins,
derives classes from `nn.Module` alone, and launches kernels on grids that are tuples or
callables computing the grid from their meta-parameters. It must define a custom kernel (a
`@triton.jit` function, or CUDA C++ with a `__global__` function handed to pycuda); it may not
catch exceptions, keep state in globals, monkey-patch, or compute with torch beyond the site's
anchor op (matmul or conv). The rules are the first wall, not the only one: the candidate also
runs sandboxed, in a process of its own, and the judge checks its outputs from outside.
"""

from __future__ import annotations

import ast
import builtins
from dataclasses import dataclass, field

from core.evaluate.allowlist import (
    ANCHOR_CALLS,
    BANNED_BUILTINS,
    BUILTINS,
    CACHING_DECORATORS,
    CUDA_LOADER_MODULES,
    ESCAPE_ATTRIBUTES,
    GRID_ATTRIBUTES,
    GRID_CALLS,
    GRID_METHODS,
    KERNEL_DECORATORS,
    MODULE_ATTRIBUTES,
    MODULES,
    allowed_path,
    banned_category,
)
from core.runtime.python_ast import parse

# Names the problem uses for its anchor ops: the families a library may compute.
ANCHOR_NAMES: dict[str, str] = {
    "linear": "matmul", "matmul": "matmul", "mm": "matmul", "bmm": "matmul", "addmm": "matmul",
    "baddbmm": "matmul", "Linear": "matmul", "Bilinear": "matmul", "einsum": "matmul",
    "conv1d": "conv", "conv2d": "conv", "conv3d": "conv", "conv_transpose1d": "conv",
    "conv_transpose2d": "conv", "conv_transpose3d": "conv", "Conv1d": "conv", "Conv2d": "conv",
    "Conv3d": "conv", "ConvTranspose1d": "conv", "ConvTranspose2d": "conv",
    "ConvTranspose3d": "conv",
}
MODULE_BASES = frozenset({"torch.nn.Module"})
ALLOWED_DUNDERS = frozenset({"__init__"})
NOT_LISTED = "not on the allowlist of what a candidate may name"
PYTHON_BUILTINS = frozenset(dir(builtins))
DOTS = frozenset({"triton.language.dot"})
TF32_REFUSED = ("TF32 products change fp32's answer, and this site's baseline multiplies in "
                "fp32: use input_precision=\"ieee\" or \"tf32x3\" (fp32's accuracy on the "
                "tensor cores), or run with --allow-tf32")


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


def bound_names(tree: ast.Module) -> set[str]:
    """Every name the module binds anywhere: assignments, definitions, parameters, loops."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store | ast.Del):
            names.add(node.id)
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.arg):
            names.add(node.arg)
        elif isinstance(node, ast.alias):
            names.add((node.asname or node.name).split(".")[0])
    return names


class _Checker(ast.NodeVisitor):
    def __init__(self, tree: ast.Module, anchors: set[str], tf32: bool) -> None:
        self.aliases = import_aliases(tree)
        self.modules = {n for n, path in self.aliases.items() if path in MODULES}
        self.own = bound_names(tree) - set(self.aliases)
        self.kernels = {n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)
                        and any(self.decorator_name(d) in KERNEL_DECORATORS
                                for d in n.decorator_list)}
        self.classes = {n.name for n in ast.walk(tree) if isinstance(n, ast.ClassDef)}
        self.grids = self.grid_bindings(tree)
        self.anchors = anchors
        self.tf32 = tf32
        self.report = StaticReport()
        self.uses_cuda_loader = False

    def flag(self, node: ast.AST, message: str) -> None:
        self.report.violations.append(f"line {getattr(node, 'lineno', '?')}: {message}")

    def decorator_name(self, decorator: ast.expr) -> str:
        target = decorator.func if isinstance(decorator, ast.Call) else decorator
        return dotted_name(target, self.aliases) or ""

    # Imports.
    def check_module_name(self, node: ast.AST, module: str) -> None:
        if module in CUDA_LOADER_MODULES or module.startswith("pycuda"):
            self.uses_cuda_loader = self.uses_cuda_loader or module in CUDA_LOADER_MODULES
        category = banned_category(module)
        if category:
            self.flag(node, f"imports {module}: candidates may not touch {category}")
        elif module not in MODULES:
            self.flag(node, f"imports {module}: a candidate may import only torch, torch.nn, "
                            "triton, triton.language, math, typing, core.runtime.cuda and "
                            "pycuda's compiler")

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
            elif module in MODULES and not allowed_path(full) and module != "__future__":
                self.flag(node, f"imports {full}: {self.why_not(full)}")
            if full == "pycuda.compiler.SourceModule" or module in CUDA_LOADER_MODULES:
                self.uses_cuda_loader = True

    # Statements.
    def visit_Try(self, node: ast.Try) -> None:
        if node.handlers:
            self.flag(node, "catches exceptions: a candidate must fail loudly, not fall back")
        self.generic_visit(node)

    visit_TryStar = visit_Try

    def visit_Global(self, node: ast.Global) -> None:
        self.flag(node, "declares globals: a candidate may not keep state across calls")

    def visit_Nonlocal(self, node: ast.Nonlocal) -> None:
        self.flag(node, "declares nonlocals: a candidate may not keep state across calls")

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        for base in node.bases:
            name = dotted_name(base, self.aliases)
            if name not in MODULE_BASES and not (isinstance(base, ast.Name)
                                                 and base.id in self.classes):
                self.flag(node, f"class {node.name} derives from {ast.unparse(base)}: a "
                                "candidate's classes derive from nn.Module only")
        if node.keywords:
            self.flag(node, f"class {node.name} passes {node.keywords[0].arg}=: no metaclasses")
        for item in node.body:
            if (isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef)
                    and item.name.startswith("__") and item.name not in ALLOWED_DUNDERS):
                self.flag(item, f"defines {item.name}: a candidate's classes define no special "
                                "methods but __init__")
        self.generic_visit(node)

    def visit_FunctionDef(self, node: ast.FunctionDef) -> None:
        for decorator in node.decorator_list:
            name = self.decorator_name(decorator)
            if name in CACHING_DECORATORS:
                self.flag(decorator, f"uses @{name}: a candidate may not cache results")
        self.generic_visit(node)

    visit_AsyncFunctionDef = visit_FunctionDef

    # Names and attributes.
    def visit_Name(self, node: ast.Name) -> None:
        if node.id in self.modules:
            self.flag(node, f"uses the module {node.id} as a value: a module may only be the "
                            "start of a dotted name")
        elif node.id in BANNED_BUILTINS:
            self.flag(node, f"uses {node.id}(): file I/O, dynamic code and reflection are off "
                            "limits")
        elif (isinstance(node.ctx, ast.Load) and node.id not in self.own
              and node.id not in self.aliases and node.id not in BUILTINS
              and (node.id in PYTHON_BUILTINS or node.id.startswith("__"))):
            # Another free name is simply undefined: a NameError when it runs.
            self.flag(node, f"uses {node.id}: not a name a candidate may use")

    def visit_Attribute(self, node: ast.Attribute) -> None:
        name = dotted_name(node, self.aliases)
        if name is not None:
            self.check_path(node, name)
            return
        self.check_attribute(node)
        if isinstance(node.ctx, ast.Store | ast.Del) and self.rooted_at_import(node):
            self.flag(node, f"assigns to {ast.unparse(node)}: candidates may not monkey-patch")
        self.generic_visit(node)

    def check_path(self, node: ast.Attribute, name: str) -> None:
        """A dotted path from an import: allowed, or flagged once with why not."""
        if isinstance(node.ctx, ast.Store | ast.Del):
            self.flag(node, f"assigns to {name}: candidates may not monkey-patch modules")
        if name.startswith(("pycuda.compiler.SourceModule", *CUDA_LOADER_MODULES)):
            self.uses_cuda_loader = True
        if not allowed_path(name) and not self.call_flagged(node, name):
            self.flag(node, f"uses {name}: {self.why_not(name)}")

    def call_flagged(self, node: ast.Attribute, name: str) -> bool:
        """Calls of compute and anchor ops are flagged (or recorded) by visit_Call."""
        return name in ANCHOR_CALLS or getattr(node, "kiln_called", False)

    def why_not(self, name: str) -> str:
        category = banned_category(name)
        if category:
            return f"candidates may not touch {category}"
        bad = next((part for part in name.split(".")[1:]
                    if part in MODULE_ATTRIBUTES or part.startswith("_")), None)
        if bad:
            return f"{bad} is off limits (a path to a module or to interpreter internals)"
        return NOT_LISTED

    def check_attribute(self, node: ast.Attribute) -> None:
        attr = node.attr
        if attr.startswith("__") and attr.endswith("__") and attr not in ALLOWED_DUNDERS:
            self.flag(node, f"uses .{attr}: interpreter internals are off limits")
        elif attr in MODULE_ATTRIBUTES or attr in ESCAPE_ATTRIBUTES:
            self.flag(node, f"uses .{attr}: streams, events, modules and ways from a tensor into "
                            "Python are off limits")
        elif attr.startswith("_") and not attr.startswith("__") and not (
                isinstance(node.value, ast.Name) and node.value.id == "self"):
            self.flag(node, f"uses .{attr}: private attributes are off limits")

    def rooted_at_import(self, node: ast.AST) -> bool:
        while isinstance(node, ast.Attribute | ast.Subscript | ast.Call):
            node = node.func if isinstance(node, ast.Call) else node.value
        return isinstance(node, ast.Name) and node.id in self.aliases

    # Calls, kernels and grids.
    def visit_Call(self, node: ast.Call) -> None:
        name = dotted_name(node.func, self.aliases) or ""
        if isinstance(node.func, ast.Attribute) and name:
            node.func.kiln_called = True  # type: ignore[attr-defined]
            self.check_call(node, name)
        if isinstance(node.func, ast.Subscript) and self.launched(node.func):
            self.check_grid(node.func.slice)
        self.generic_visit(node)

    def check_call(self, node: ast.Call, name: str) -> None:
        if name in DOTS:
            self.check_dot_precision(node)
        family = ANCHOR_CALLS.get(name)
        if family:
            if family in self.anchors:
                self.report.library_ops.append(name)
            else:
                self.flag(node, f"calls {name}: a library {family} is allowed only on a "
                                f"{family} site, and this site has none")
        elif not allowed_path(name):
            why = self.why_not(name)
            if name.startswith("torch.") and why == NOT_LISTED:
                self.flag(node, f"calls {name}: the site's compute must be done by the "
                                "candidate's own kernels")
            else:
                self.flag(node, f"uses {name}: {why}")

    def check_dot_precision(self, node: ast.Call) -> None:
        """fp32 products stay fp32 unless the site's baseline multiplies in TF32: a dot's
        precision is written out, and is not TF32 (Triton's own default is made exact for
        the candidate's process, `core.timing.precision.hold_candidate_to`)."""
        given = {k.arg: k.value for k in node.keywords}
        for position, keyword in ((3, "input_precision"), (4, "allow_tf32")):
            if len(node.args) > position:
                given[keyword] = node.args[position]
        precision, allow = given.get("input_precision"), given.get("allow_tf32")
        if precision is not None and not (isinstance(precision, ast.Constant)
                                          and isinstance(precision.value, str | None)):
            self.flag(node, "a dot's input_precision must be written as a string literal")
        elif isinstance(precision, ast.Constant) and precision.value == "tf32" and not self.tf32:
            self.flag(node, TF32_REFUSED)
        if allow is not None and not self.tf32 and not (
                isinstance(allow, ast.Constant) and allow.value in (False, None)):
            self.flag(node, TF32_REFUSED)

    def launched(self, subscript: ast.Subscript) -> bool:
        return isinstance(subscript.value, ast.Name) and subscript.value.id in self.kernels

    def grid_bindings(self, tree: ast.Module) -> dict[str, list[ast.AST]]:
        """What each name is bound to, for the grids launches name."""
        found: dict[str, list[ast.AST]] = {}
        for node in ast.walk(tree):
            if isinstance(node, ast.Assign):
                for target in node.targets:
                    if isinstance(target, ast.Name):
                        found.setdefault(target.id, []).append(node.value)
            elif isinstance(node, ast.AnnAssign | ast.AugAssign) and node.value is not None:
                if isinstance(node.target, ast.Name):
                    found.setdefault(node.target.id, []).append(node.value)
            elif isinstance(node, ast.FunctionDef):
                found.setdefault(node.name, []).append(node)
            elif isinstance(node, ast.arg):
                found.setdefault(node.arg, []).append(node)
        return found

    def check_grid(self, grid: ast.expr) -> None:
        values: list[ast.AST] = [grid]
        if isinstance(grid, ast.Name):
            values = self.grids.get(grid.id, [grid])
        for value in values:
            if isinstance(value, ast.Tuple | ast.List):
                continue
            if isinstance(value, ast.Lambda) and self.grid_pure(value.body):
                continue
            if isinstance(value, ast.FunctionDef) and self.grid_function(value):
                continue
            self.flag(grid, f"launches on the grid {ast.unparse(grid)}: a grid is a tuple, or a "
                            "callable that only computes it from its meta-parameters")

    def grid_function(self, function: ast.FunctionDef) -> bool:
        body = [s for s in function.body if not (isinstance(s, ast.Expr)
                                                and isinstance(s.value, ast.Constant))]
        return (len(body) == 1 and isinstance(body[0], ast.Return)
                and body[0].value is not None and self.grid_pure(body[0].value))

    def grid_pure(self, node: ast.AST) -> bool:
        """Whether an expression only computes numbers from names, constants and sizes."""
        if isinstance(node, ast.Constant | ast.Name):
            return True
        if isinstance(node, ast.Tuple | ast.List):
            return all(self.grid_pure(e) for e in node.elts)
        if isinstance(node, ast.Starred):
            return self.grid_pure(node.value)
        if isinstance(node, ast.Subscript):
            return self.grid_pure(node.value) and self.grid_pure(node.slice)
        if isinstance(node, ast.Slice):
            return all(self.grid_pure(p) for p in (node.lower, node.upper, node.step) if p)
        if isinstance(node, ast.BinOp):
            return self.grid_pure(node.left) and self.grid_pure(node.right)
        if isinstance(node, ast.UnaryOp):
            return self.grid_pure(node.operand)
        if isinstance(node, ast.BoolOp):
            return all(self.grid_pure(v) for v in node.values)
        if isinstance(node, ast.Compare):
            return all(self.grid_pure(v) for v in [node.left, *node.comparators])
        if isinstance(node, ast.IfExp):
            return all(self.grid_pure(v) for v in (node.test, node.body, node.orelse))
        if isinstance(node, ast.Attribute):
            return node.attr in GRID_ATTRIBUTES and self.grid_pure(node.value)
        if isinstance(node, ast.Call) and not node.keywords:
            func = node.func
            name = dotted_name(func, self.aliases) or (func.id if isinstance(func, ast.Name)
                                                       else "")
            method = isinstance(func, ast.Attribute) and func.attr in GRID_METHODS and \
                self.grid_pure(func.value)
            allowed = name in GRID_CALLS or name.startswith("math.") or method
            return allowed and all(self.grid_pure(a) for a in node.args)
        return False

    def visit_Lambda(self, node: ast.Lambda) -> None:
        if not self.grid_pure(node.body):
            self.flag(node, "a lambda may only compute a launch grid from its meta-parameters")
        self.generic_visit(node)

    def visit_Constant(self, node: ast.Constant) -> None:
        if isinstance(node.value, str) and "__global__" in node.value:
            self.report.cuda_sources.append((node.lineno, node.value))
            if not self.tf32 and "tf32" in node.value.lower():
                self.flag(node, "its CUDA source uses TF32: " + TF32_REFUSED)


def check_candidate(candidate_source: str, problem_source: str, tf32: bool = False
                    ) -> StaticReport:
    """Apply every static rule; raises SyntaxError when the candidate does not parse. `tf32`:
    whether the site's fp32 products may be TF32 (`EvalConfig.tf32_for`)."""
    tree = parse(candidate_source)
    checker = _Checker(tree, problem_anchors(problem_source), tf32)
    checker.visit(tree)
    report = checker.report
    if checker.kernels:
        report.tier = "triton"
    if report.cuda_sources and checker.uses_cuda_loader:
        report.tier = "cuda" if not report.tier else "triton+cuda"
    if not report.tier:
        report.violations.append(
            "no custom kernel: define a @triton.jit kernel, or CUDA C++ with a __global__ "
            "function loaded through pycuda or core.runtime.cuda"
        )
    return report
