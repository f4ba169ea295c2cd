"""Small helpers shared by the kernel writers."""

from __future__ import annotations

from generators.site_graph import Op, Ref

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
