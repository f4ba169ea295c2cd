"""A site problem lowered to the compiler's IR, through PyTorch's own decompositions.

The problem's `Model` is traced on meta tensors into ATen ops, with the core decompositions
and those of softmax, log_softmax and the norms, so that every site comes down to a small set:
elementwise ops, views, reductions (sum, mean, amax, amin, prod, var, argmax, argmin), scans and
gathers. Each becomes an IR value (`generators.compiler.ir`). A value the outputs do not need is
never lowered, so an op nobody reads cannot stop a site; an op the outputs need and the IR
cannot express stops it, with its name.
"""

from __future__ import annotations

import functools
import operator
from collections.abc import Callable
from pathlib import Path

import torch
import torch.fx as fx

from generators.compiler.ir import (
    Cast,
    Constant,
    Elementwise,
    Gather,
    Graph,
    Input,
    Missing,
    Reduce,
    Scan,
    Value,
    View,
)
from generators.compiler.library import CONVOLUTIONS, LibraryLowering
from generators.compiler.windows import WindowLowering, argument
from generators.op_table import ELEMENTWISE_OPS
from generators.site_graph import Unsupported

aten = torch.ops.aten
# Composite ops the core decompositions keep whole, taken apart so the IR need not know them.
_COMPOSITES = ("_softmax", "_log_softmax", "native_group_norm", "native_layer_norm",
               "native_batch_norm", "_native_batch_norm_legit",
               "_native_batch_norm_legit_functional", "_native_batch_norm_legit_no_training",
               "linalg_vector_norm", "std.correction", "logsumexp", "dist")
# Factories of uninitialized tensors: a copy_ into one is its source, nothing overwritten,
# where nothing else reads it but for its shape (`_SHAPED_LIKE`).
_EMPTY = (aten.empty, aten.empty_like, aten.empty_permuted, aten.empty_strided, aten.new_empty,
          aten.new_empty_strided)
_SHAPED_LIKE = (aten.empty_like, aten.full_like, aten.zeros_like, aten.ones_like)
_IDENTITIES = ("clone", "alias", "detach", "lift_fresh_copy", "contiguous")
_VIEWS = ("view", "_unsafe_view", "reshape", "unsqueeze", "squeeze", "flatten")


def _packet(node: fx.Node) -> object:
    return getattr(node.target, "_overloadpacket", None)


@functools.cache
def decompositions() -> dict:
    from torch._decomp import core_aten_decompositions, decomposition_table

    table = dict(core_aten_decompositions())
    for name in _COMPOSITES:
        packet, _, overload = name.partition(".")
        op = getattr(getattr(aten, packet), overload or "default")
        if op in decomposition_table:
            table[op] = decomposition_table[op]
    return table


def trace(model: torch.nn.Module, inputs: list[object]) -> fx.GraphModule:
    """`model` as ATen ops, traced on fake tensors shaped like `inputs`."""
    from torch.fx.experimental.proxy_tensor import make_fx

    try:
        return make_fx(model, decomposition_table=decompositions(),
                       tracing_mode="fake")(*inputs)
    except Exception as err:
        raise Unsupported(f"the site does not trace into ATen ops: {type(err).__name__}: "
                          f"{str(err).splitlines()[0][:200]}") from err


def lower_problem(problem: Path, library_layout: str = "") -> Graph:
    """The site problem at `problem` as IR; `library_layout`: how its convolution is computed
    (`generators.compiler.library.CONVOLUTIONS`)."""
    from core.runtime.problem_loader import load_problem

    loaded = load_problem(problem, captured=False)
    if loaded.init_inputs():
        raise Unsupported("the compiler takes stateless site problems (no init inputs)")
    inputs = loaded.inputs(0, "meta")
    with torch.device("meta"):
        model = loaded.model_class()
    return lower(trace(model, inputs), library_layout)


def _dims(dims: object, rank: int) -> tuple[int, ...]:
    """Reduction dims as non-negative ints; None or [] is every dim."""
    if dims is None or dims == []:
        return tuple(range(rank))
    listed = [dims] if isinstance(dims, int) else list(dims)
    return tuple(sorted({d % rank if rank else 0 for d in listed}))


class _Lowering(LibraryLowering, WindowLowering):
    def __init__(self, gm: fx.GraphModule, library_layout: str = "") -> None:
        self.gm = gm
        self.library_layout = library_layout
        self.done: dict[fx.Node, object] = {}
        self.inputs: list[Input] = []
        for node in gm.graph.nodes:
            if node.op == "placeholder":
                meta = node.meta["val"]
                value = Input(tuple(meta.shape), meta.dtype, index=len(self.inputs),
                              stride=tuple(meta.stride()))
                self.inputs.append(value)
                self.done[node] = value

    def value(self, arg: object) -> object:
        """An fx argument as IR: a node's value, a constant as it is, lists element-wise."""
        if isinstance(arg, fx.Node):
            if arg not in self.done:
                self.done[arg] = self.lower_node(arg)
            return self.done[arg]
        if isinstance(arg, list | tuple):
            return type(arg)(self.value(a) for a in arg)
        return arg

    def lower_node(self, node: fx.Node) -> object:
        if node.op != "call_function":
            raise Unsupported(f"{node.op} {node.target} in the traced site")
        if node.target is operator.getitem:
            return self.value(node.args[0])[node.args[1]]
        packet = _packet(node)
        name = packet.__name__ if packet is not None else str(node.target)
        meta = node.meta.get("val")
        if isinstance(meta, torch.Tensor):
            shape, dtype = tuple(meta.shape), meta.dtype
        else:
            shape, dtype = (), torch.float32
        handler: Callable | None = getattr(self, f"lower_{name}", None)
        if handler is not None:
            return handler(node, shape, dtype)
        if name in _IDENTITIES:
            return self.value(node.args[0])
        if name in _VIEWS:
            return self.reshaped(node, shape, dtype)
        if name in ELEMENTWISE_OPS:
            return self.elementwise(node, name, shape, dtype)
        if name.endswith("_") and name[:-1] in ELEMENTWISE_OPS:
            return self.in_place(node, name, shape, dtype)
        raise Unsupported(f"{name} (aten.{name}) has no lowering to the compiler's IR")

    def in_place(self, node: fx.Node, name: str, shape: tuple[int, ...],
                 dtype: torch.dtype) -> Value:
        """An in-place elementwise op (a decomposition's `add_` on its own temporary) as its
        functional twin, where nothing else reads the value it overwrites."""
        target = node.args[0]
        if not isinstance(target, fx.Node) or target.op == "placeholder" or len(target.users) > 1:
            raise Unsupported(f"{name} (aten.{name}) overwrites a value the site reads "
                              "elsewhere: the compiler lowers in-place ops only on temporaries")
        return self.elementwise(node, name[:-1], shape, dtype)

    def elementwise(self, node: fx.Node, op: str, shape: tuple[int, ...],
                    dtype: torch.dtype) -> Value:
        args = tuple(self.value(a) for a in node.args)
        kwargs = tuple((k, self.value(v)) for k, v in node.kwargs.items())
        return Elementwise(shape, dtype, op=op, args=args, kwargs=kwargs)

    def reshaped(self, node: fx.Node, shape: tuple[int, ...], dtype: torch.dtype) -> Value:
        source = self.value(node.args[0])
        if tuple(source.shape) == shape:
            return source
        return View(shape, dtype, source=source, kind="reshape")

    def lower_permute(self, node, shape, dtype) -> Value:
        source = self.value(node.args[0])
        dims = tuple(d % len(shape) for d in node.args[1])
        return View(shape, dtype, source=source, kind="permute", dims=dims)

    def lower_t(self, node, shape, dtype) -> Value:
        source = self.value(node.args[0])
        return View(shape, dtype, source=source, kind="permute",
                    dims=(1, 0) if len(shape) == 2 else (0,))

    def lower_transpose(self, node, shape, dtype) -> Value:
        source = self.value(node.args[0])
        a, b = (d % len(shape) for d in node.args[1:3])
        dims = list(range(len(shape)))
        dims[a], dims[b] = dims[b], dims[a]
        return View(shape, dtype, source=source, kind="permute", dims=tuple(dims))

    def lower_expand(self, node, shape, dtype) -> Value:
        source = self.value(node.args[0])
        if tuple(source.shape) == shape:
            return source
        return View(shape, dtype, source=source, kind="expand")

    def lower__to_copy(self, node, shape, dtype) -> Value:
        source = self.value(node.args[0])
        return source if source.dtype == dtype else Cast(shape, dtype, source=source)

    lower_convert_element_type = lower__to_copy

    def lower_copy_(self, node, shape, dtype) -> Value:
        """copy_ into a tensor made empty for it (a decomposition filling one, as a cosine
        embedding loss's does): its source, cast and broadcast to it. Into anything else (an
        input, a value read elsewhere) it would be a write the IR does not make."""
        target = node.args[0]
        made = (isinstance(target, fx.Node) and target.op == "call_function"
                and _packet(target) in _EMPTY
                and all(user is node or _packet(user) in _SHAPED_LIKE for user in target.users))
        if not made:
            raise Unsupported("copy_ (aten.copy_) writes into a tensor the site did not make "
                              "for it: the compiler lowers copies only into fresh tensors")
        source = self.value(node.args[1])
        if source.dtype != dtype:
            source = Cast(source.shape, dtype, source=source)
        if tuple(source.shape) == shape:
            return source
        return View(shape, dtype, source=source, kind="expand")

    def lower_scalar_tensor(self, node, shape, dtype) -> Value:
        return Constant(shape, dtype, value=node.args[0])

    def lower_full(self, node, shape, dtype) -> Value:
        return Constant(shape, dtype, value=node.args[1])

    def lower_full_like(self, node, shape, dtype) -> Value:
        return Constant(shape, dtype, value=node.args[1])

    def lower_zeros_like(self, node, shape, dtype) -> Value:
        return Constant(shape, dtype, value=0)

    def lower_ones_like(self, node, shape, dtype) -> Value:
        return Constant(shape, dtype, value=1)

    lower_zeros = lower_zeros_like
    lower_ones = lower_ones_like

    def reduction(self, node, shape, dtype, kind: str, dims: object, keepdim: bool,
                  correction: float = 0.0) -> Value:
        source = self.value(node.args[0])
        reduced = _dims(dims, len(source.shape))
        if not source.shape:
            return source
        return Reduce(shape, dtype, source=source, kind=kind, dims=reduced, keepdim=keepdim,
                      correction=correction)

    def simple(self, node, shape, dtype, kind: str) -> Value:
        """sum, mean, amax, amin, prod, any, all: (input, dims, keepdim)."""
        dims = argument(node, 1, "dim")
        return self.reduction(node, shape, dtype, kind, dims, bool(argument(node, 2, "keepdim",
                                                                        False)))

    def lower_sum(self, node, shape, dtype) -> Value:
        return self.simple(node, shape, dtype, "sum")

    def lower_mean(self, node, shape, dtype) -> Value:
        return self.simple(node, shape, dtype, "mean")

    def lower_amax(self, node, shape, dtype) -> Value:
        return self.simple(node, shape, dtype, "amax")

    def lower_amin(self, node, shape, dtype) -> Value:
        return self.simple(node, shape, dtype, "amin")

    def lower_prod(self, node, shape, dtype) -> Value:
        return self.simple(node, shape, dtype, "prod")

    def lower_any(self, node, shape, dtype) -> Value:
        return self.simple(node, shape, dtype, "amax")

    def lower_all(self, node, shape, dtype) -> Value:
        return self.simple(node, shape, dtype, "amin")

    def lower_var(self, node, shape, dtype) -> Value:
        dims = argument(node, 1, "dim")
        correction = node.kwargs.get("correction", 1)
        keepdim = node.kwargs.get("keepdim", False)
        return self.reduction(node, shape, dtype, "var", dims, keepdim,
                              1.0 if correction is None else float(correction))

    def lower_var_mean(self, node, shape, dtype) -> tuple[Value, Value]:
        meta = node.meta["val"]
        dims = argument(node, 1, "dim")
        correction = node.kwargs.get("correction", 1)
        keepdim = node.kwargs.get("keepdim", False)
        var = self.reduction(node, tuple(meta[0].shape), meta[0].dtype, "var", dims, keepdim,
                             1.0 if correction is None else float(correction))
        mean = self.reduction(node, tuple(meta[1].shape), meta[1].dtype, "mean", dims, keepdim)
        return var, mean

    def arg_reduction(self, node, shape, dtype, kind: str) -> Value:
        source = self.value(node.args[0])
        dim = argument(node, 1, "dim")
        keepdim = bool(argument(node, 2, "keepdim", False))
        if dim is None:
            if len(source.shape) > 1:
                flat = View((source.numel,), source.dtype, source=source, kind="reshape")
                return Reduce(shape, dtype, source=flat, kind=kind, dims=(0,), keepdim=keepdim)
            dim = 0
        return Reduce(shape, dtype, source=source, kind=kind,
                      dims=(dim % max(len(source.shape), 1),), keepdim=keepdim)

    def extreme(self, node, shape, dtype, kind: str) -> object:
        """max/min: of everything, along a dimension (values and indices), or of two."""
        overload = node.target._overloadname
        if overload == "other":
            return Elementwise(shape, dtype, op="maximum" if kind == "amax" else "minimum",
                               args=tuple(self.value(a) for a in node.args[:2]))
        if overload == "default":
            return self.reduction(node, shape, dtype, kind, None, False)
        meta = node.meta["val"]
        keepdim = bool(argument(node, 2, "keepdim", False))
        values = self.reduction(node, tuple(meta[0].shape), meta[0].dtype, kind,
                                node.args[1], keepdim)
        indices = self.arg_reduction(node, tuple(meta[1].shape), meta[1].dtype,
                                     "argmax" if kind == "amax" else "argmin")
        return values, indices

    def lower_max(self, node, shape, dtype) -> object:
        return self.extreme(node, shape, dtype, "amax")

    def lower_min(self, node, shape, dtype) -> object:
        return self.extreme(node, shape, dtype, "amin")

    def lower_argmax(self, node, shape, dtype) -> Value:
        return self.arg_reduction(node, shape, dtype, "argmax")

    def lower_argmin(self, node, shape, dtype) -> Value:
        return self.arg_reduction(node, shape, dtype, "argmin")

    def scan(self, node, shape, dtype, kind: str) -> Value:
        source = self.value(node.args[0])
        dim = node.args[1] % max(len(shape), 1)
        if source.dtype != dtype:
            source = Cast(source.shape, dtype, source=source)
        return Scan(shape, dtype, source=source, kind=kind, dim=dim)

    def lower_cumsum(self, node, shape, dtype) -> Value:
        return self.scan(node, shape, dtype, "cumsum")

    def lower_cumprod(self, node, shape, dtype) -> Value:
        return self.scan(node, shape, dtype, "cumprod")

    def lower_logcumsumexp(self, node, shape, dtype) -> Value:
        return self.scan(node, shape, dtype, "logcumsumexp")

    def running_extreme(self, node, kind: str) -> tuple[Value, Missing]:
        """cummax/cummin: the running values; their indices are not computed."""
        meta = node.meta["val"]
        values = self.scan(node, tuple(meta[0].shape), meta[0].dtype, kind)
        return values, Missing(values.shape, torch.int64, why=f"the indices of {kind}")

    def lower_cummax(self, node, shape, dtype) -> tuple[Value, Missing]:
        return self.running_extreme(node, "cummax")

    def lower_cummin(self, node, shape, dtype) -> tuple[Value, Missing]:
        return self.running_extreme(node, "cummin")

    def lower_gather(self, node, shape, dtype) -> Value:
        source, dim, index = (self.value(a) for a in node.args[:3])
        return Gather(shape, dtype, source=source, dim=dim % len(shape), index=index)


def lower(gm: fx.GraphModule, library_layout: str = "") -> Graph:
    """The traced site as IR; its outputs in return order."""
    if library_layout not in CONVOLUTIONS:
        raise Unsupported(f"a convolution by {library_layout!r} (known: "
                          f"{', '.join(map(repr, CONVOLUTIONS))})")
    lowering = _Lowering(gm, library_layout)
    (output,) = [n for n in gm.graph.nodes if n.op == "output"]
    returned = output.args[0]
    many = isinstance(returned, list | tuple)
    values = [lowering.value(r) for r in (returned if many else [returned])]
    for value in values:
        if not isinstance(value, Value):
            raise Unsupported(f"the site returns {type(value).__name__}, not a tensor")
        if isinstance(value, Input) and value.call:
            raise Unsupported("the site returns the library's output as it is (a convolution "
                              "with no bias and nothing after it): nothing for a kernel to do")
    if library_layout and not any(v.call for v in lowering.inputs):
        raise Unsupported(f"a convolution by {library_layout!r}, in a site that makes none")
    return Graph(lowering.inputs, values, returns_tuple=many and len(values) > 1)
