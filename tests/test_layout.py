"""The layout: rooms by pipeline stage, every import running downward, no circles, short files."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# Lowest first: a room may import its own modules and the rooms before it, never one after it.
ROOMS = ("core.runtime", "core.timing", "core.profile", "core.evaluate", "generators",
         "core.search", "store", "core.optimize", "app")
# The template of the exported package: it imports the copy of core/runtime it ships beside.
NOT_KILN = ("store.package_files",)
MAX_LINES = 450


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def kiln_modules() -> dict[str, Path]:
    paths = [ROOT / "app.py", *ROOT.glob("app_pages/**/*.py"), *ROOT.glob("core/**/*.py"),
             *ROOT.glob("generators/**/*.py"), *ROOT.glob("store/**/*.py")]
    modules = {module_name(p): p for p in paths}
    return {name: p for name, p in modules.items() if not name.startswith(NOT_KILN)}


def room_of(module: str) -> str:
    if module in ("app", "core.cuda_runtime", "core") or module.startswith("app_pages"):
        return {"app": "app", "core": "core.runtime", "core.cuda_runtime": "core.runtime"}.get(
            module, "app")
    return next(room for room in ROOMS if module == room or module.startswith(room + "."))


def imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The Kiln modules `name` imports anywhere in its file, functions included."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                package = name if path.name == "__init__.py" else name.rpartition(".")[0]
                for _ in range(node.level - 1):
                    package = package.rpartition(".")[0]
                base = f"{package}.{base}" if base else package
            targets = [f"{base}.{alias.name}" for alias in node.names] + [base]
        else:
            continue
        for target in targets:
            while target and target not in modules:
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
    return found


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    modules = kiln_modules()
    return {name: imports(name, path, modules) for name, path in modules.items()}


def test_every_module_is_in_a_room(graph: dict[str, set[str]]) -> None:
    for name in graph:
        assert room_of(name) in ROOMS, name


def test_imports_run_downward_only(graph: dict[str, set[str]]) -> None:
    upward = [f"{name} ({room_of(name)}) imports {target} ({room_of(target)})"
              for name, targets in graph.items() for target in sorted(targets)
              if ROOMS.index(room_of(target)) > ROOMS.index(room_of(name))]
    assert not upward, "imports from a lower room to a higher one:\n" + "\n".join(upward)


def test_no_import_circle(graph: dict[str, set[str]]) -> None:
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    circles: list[list[str]] = []

    def visit(module: str, path: list[str]) -> None:
        state[module] = 1
        path.append(module)
        for target in sorted(graph[module]):
            if state.get(target) == 1:
                circles.append(path[path.index(target):] + [target])
            elif target not in state:
                visit(target, path)
        path.pop()
        state[module] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module, [])
    assert not circles, "import circles:\n" + "\n".join(" -> ".join(c) for c in circles)


def test_runtime_reaches_only_itself_and_by_relative_names() -> None:
    """The package export copies core/runtime whole, as a package of another name."""
    for name, path in kiln_modules().items():
        if not name.startswith("core.runtime"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            absolute = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                        [node.module] if isinstance(node, ast.ImportFrom) and not node.level
                        else [])
            kiln = [m for m in absolute if m and m.split(".")[0] in ("core", "generators",
                                                                     "store", "app_pages")]
            assert not kiln, f"{name} line {node.lineno} imports {kiln[0]} by its absolute name"


def test_no_module_is_over_the_line_limit() -> None:
    long = {str(p.relative_to(ROOT)): n for p in kiln_modules().values()
            if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert not long, f"modules over {MAX_LINES} lines: {long}"
