"""Small helpers shared by the kernel writers."""

from __future__ import annotations

from generators.site_graph import Op, Ref

# Elementwise operators every kernel language spells the same way.
BINARY_OPERATORS = {"add": "+", "sub": "-", "mul": "*", "div": "/", "true_divide": "/",
                    "multiply": "*", "subtract": "-", "divide": "/"}
COMPARISONS = {"eq": "==", "ne": "!=", "lt": "<", "le": "<=", "gt": ">", "ge": ">=",
               "greater": ">", "less": "<"}

# Generated candidates are self-contained files, so each carries this helper in its text.
BROADCAST_SHAPE_HELPER = '''def _broadcast_shape(shapes):
    rank = max(len(s) for s in shapes)
    result = [1] * rank
    for shape in shapes:
        for i, size in enumerate(shape, rank - len(shape)):
            if size != 1:
                result[i] = size
    return tuple(result)
'''


def indent(lines: list[str], depth: int) -> str:
    return "\n".join(" " * depth + line for line in lines)


def refs_in(values: tuple) -> list[Ref]:
    """Every Ref in `values`, nested tuples included, in order."""
    found: list[Ref] = []
    for value in values:
        if isinstance(value, Ref):
            found.append(value)
        elif isinstance(value, tuple):
            found += refs_in(value)
    return found


def op_refs(op: Op) -> list[Ref]:
    return refs_in(op.args + tuple(v for _, v in op.kwargs))


def arg_at(op: Op, index: int, default: object = None) -> object:
    """Positional argument `index` of `op`, or `default` when it was not passed."""
    return op.args[index] if index < len(op.args) else default


def arg(op: Op, name: str, position: int, default: object = None) -> object:
    """An argument passed by keyword `name` or at `position`, else `default`."""
    return op.kwarg(name, arg_at(op, position, default))
