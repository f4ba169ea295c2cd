"""Small helpers shared by the kernel writers."""

from __future__ import annotations

from generators.site_graph import Op, Ref, SiteGraph

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


# The SM count of the tensor's `device`, for grids sized per SM. The Triton interpreter runs on
# the CPU, where there are no SMs to count: one stands in.
SM_COUNT_LINE = ('sms = torch.cuda.get_device_properties(device).multi_processor_count '
                 'if device.type == "cuda" else 1')


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


def ops_needed(graph: SiteGraph, roots: list[Ref], given: set[Ref]) -> set[int]:
    """Indices of the ops the `roots` depend on, not looking through the `given` values."""
    found: set[int] = set()
    pending = [r for r in roots if not r.is_input and r not in given]
    while pending:
        ref = pending.pop()
        if ref.index not in found:
            found.add(ref.index)
            pending += [r for r in op_refs(graph.ops[ref.index])
                        if not r.is_input and r not in given]
    return found


def arg_at(op: Op, index: int, default: object = None) -> object:
    """Positional argument `index` of `op`, or `default` when it was not passed."""
    return op.args[index] if index < len(op.args) else default


def arg(op: Op, name: str, position: int, default: object = None) -> object:
    """An argument passed by keyword `name` or at `position`, else `default`."""
    return op.kwarg(name, arg_at(op, position, default))


# Generated candidates carry this helper too. It views the output as rows × columns: adjacent
# dims that every tensor walks as one are merged (size-1 dims dropped), the innermost merged
# dim becomes the columns and the others stay row dims, so a kernel decomposes coordinates once
# per row and walks each tensor along a row with a single stride.
ROWS_AND_COLUMNS_HELPER = '''def _rows_and_columns(shape, strides, row_dims):
    """The row dims' sizes (`row_dims` of them, padded with size 1 on the inside), the column
    count, each tensor's strides over the row dims then along the columns, and whether an
    offset can pass 32 bits."""
    dims = []
    for d, size in enumerate(shape):
        if size == 1:
            continue
        walk = [s[d] for s in strides]
        if dims and all(outer == inner * size for outer, inner in zip(dims[-1][1], walk)):
            dims[-1] = (dims[-1][0] * size, walk)
        else:
            dims.append((size, walk))
    n_cols, col_strides = dims.pop() if dims else (1, [0] * len(strides))
    dims += [(1, [0] * len(strides))] * (row_dims - len(dims))
    per_tensor = [[walk[t] for _, walk in dims] + [col_strides[t]] for t in range(len(strides))]
    numel = 1
    for size in shape:
        numel *= size
    reach = max([numel] + [1 + sum((n - 1) * s for n, s in zip(shape, st)) for st in strides])
    return [size for size, _ in dims], n_cols, per_tensor, reach >= 2**31
'''
