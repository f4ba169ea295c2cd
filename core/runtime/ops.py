"""What each captured op is: its canonical name, its kind, and how to make it out-of-place.

Graphs captured by torch.compile speak torch's Python-level API, where one op has many
spellings (`a + b`, `torch.add`, `a.add`, `a.add_`, `a += b`). This registry folds them into one
canonical name and a kind that partitioning understands. Anything not listed is `OTHER` and
stays with PyTorch.
"""

from __future__ import annotations

import enum
import operator
from dataclasses import dataclass

import torch
import torch.fx as fx
import torch.nn.functional as F


class OpKind(enum.Enum):
    POINTWISE = "pointwise"
    REDUCTION = "reduction"
    MATMUL = "matmul"
    CONV = "conv"
    ATTENTION = "attention"
    VIEW = "view"  # aliases, layout and identity ops: free, kept with PyTorch
    OTHER = "other"


POINTWISE_NAMES = frozenset(
    """abs acos acosh add addcdiv addcmul asin asinh atan atan2 atanh bitwise_and bitwise_not
    bitwise_or bitwise_xor ceil celu clamp clamp_max clamp_min clip cos cosh div divide elu eq
    erf erfc erfinv exp exp2 expm1 floor floor_divide fmod frac ge gelu greater gt hardshrink
    hardsigmoid hardswish hardtanh le leaky_relu lerp less log log10 log1p log2 logical_and
    logical_not logical_or logical_xor logit logsigmoid lt masked_fill maximum minimum mish mul
    multiply nan_to_num ne neg negative pow reciprocal relu relu6 remainder round rrelu rsqrt rsub
    selu sigmoid sign silu sin sinh softplus softshrink softsign sqrt square sub subtract tan
    tanh tanhshrink threshold true_divide trunc where xlogy float half bfloat16 double to
    type_as""".split()
)
REDUCTION_NAMES = frozenset(
    """sum mean amax amin prod var std logsumexp softmax log_softmax softmin layer_norm rms_norm
    group_norm batch_norm instance_norm normalize norm max min argmax argmin all any cumsum
    cumprod var_mean std_mean mse_loss l1_loss smooth_l1_loss huber_loss kl_div cross_entropy
    nll_loss binary_cross_entropy binary_cross_entropy_with_logits hinge_embedding_loss
    soft_margin_loss cosine_similarity avg_pool1d avg_pool2d avg_pool3d max_pool1d max_pool2d
    max_pool3d adaptive_avg_pool1d adaptive_avg_pool2d adaptive_avg_pool3d adaptive_max_pool1d
    adaptive_max_pool2d adaptive_max_pool3d triplet_margin_loss margin_ranking_loss
    cosine_embedding_loss pairwise_distance poisson_nll_loss gaussian_nll_loss
    multilabel_soft_margin_loss nansum nanmean count_nonzero dist aminmax logcumsumexp cummax
    cummin""".split()
)
# Reductions that return a tuple of tensors (`max(x, dim)` gives values and indices).
TUPLE_REDUCTIONS = frozenset("max min var_mean std_mean aminmax cummax cummin".split())
MATMUL_NAMES = frozenset("linear matmul mm bmm addmm baddbmm addmv".split())
CONV_NAMES = frozenset(
    "conv1d conv2d conv3d conv_transpose1d conv_transpose2d conv_transpose3d".split()
)
ATTENTION_NAMES = frozenset({"scaled_dot_product_attention"})
VIEW_NAMES = frozenset(
    """view reshape permute transpose t unsqueeze squeeze flatten unflatten expand expand_as
    view_as reshape_as contiguous getitem split chunk narrow select unbind movedim swapaxes
    detach dropout alpha_dropout feature_alpha_dropout dropout1d dropout2d dropout3d
    identity""".split()
)
# Tensor factories of fixed size and value (`torch.ones(t, t)`, `x.new_full((), 2.0)`): a mask
# built from them inside a site is one of its constants.
FACTORY_NAMES = frozenset("ones zeros full new_ones new_zeros new_full".split())
_FACTORY_KWARGS = frozenset({"dtype", "device", "layout", "requires_grad", "pin_memory",
                             "fill_value"})

_OPERATOR_NAMES = {
    operator.add: "add",
    operator.sub: "sub",
    operator.mul: "mul",
    operator.truediv: "div",
    operator.floordiv: "floor_divide",
    operator.mod: "remainder",
    operator.pow: "pow",
    operator.neg: "neg",
    operator.eq: "eq",
    operator.ne: "ne",
    operator.lt: "lt",
    operator.le: "le",
    operator.gt: "gt",
    operator.ge: "ge",
    operator.and_: "bitwise_and",
    operator.or_: "bitwise_or",
    operator.xor: "bitwise_xor",
    operator.invert: "bitwise_not",
    operator.matmul: "matmul",
    operator.getitem: "getitem",
}
# Operator methods some torch versions' Dynamo records as `call_method` (`mask == 0` as
# `mask.__eq__(0)` in torch 2.11): the operator each one is, and whether its operands swap
# (`x.__rsub__(1)` is `1 - x`).
_UNREFLECTED = {operator.eq, operator.ne, operator.lt, operator.le, operator.gt, operator.ge,
                operator.neg, operator.invert, operator.getitem}
DUNDER_OPERATORS = {
    **{f"__{op.__name__.rstrip('_')}__": (op, False) for op in _OPERATOR_NAMES},
    **{f"__r{op.__name__.rstrip('_')}__": (op, True) for op in _OPERATOR_NAMES
       if op not in _UNREFLECTED},
}
# In-place operators and the out-of-place operator each one becomes.
INPLACE_OPERATORS = {
    operator.iadd: operator.add,
    operator.isub: operator.sub,
    operator.imul: operator.mul,
    operator.itruediv: operator.truediv,
    operator.ifloordiv: operator.floordiv,
    operator.imod: operator.mod,
    operator.ipow: operator.pow,
    operator.iand: operator.and_,
    operator.ior: operator.or_,
    operator.ixor: operator.xor,
}
# Modules whose functions may be spelled by their short name in a problem file.
_FUNCTION_HOMES = (
    ("torch.nn.functional", F),
    ("torch", torch),
    ("torch.special", torch.special),
    ("torch.nn.functional", torch._C._nn),
)


@dataclass(frozen=True)
class OpInfo:
    name: str  # canonical name, e.g. "add" for `a + b`, `torch.add`, `a.add`
    kind: OpKind
    inplace: bool  # mutates its first argument


def function_name(target: object) -> str | None:
    """The short public name of a torch function or operator, or None if it has none."""
    if target in _OPERATOR_NAMES:
        return _OPERATOR_NAMES[target]
    if target in INPLACE_OPERATORS:
        return _OPERATOR_NAMES[INPLACE_OPERATORS[target]]
    name = getattr(target, "__name__", None)
    if name is None:
        return None
    for _, home in _FUNCTION_HOMES:
        if getattr(home, name, None) is target:
            return name
    return None


def qualified_function_name(target: object) -> str | None:
    """The dotted name a problem file uses to call `target`, e.g. `torch.nn.functional.gelu`."""
    name = getattr(target, "__name__", None)
    if name is None:
        return None
    for module_name, home in _FUNCTION_HOMES:
        if getattr(home, name, None) is target:
            return f"{module_name}.{name}"
    return None


def _kind_of_name(name: str) -> OpKind:
    for names, kind in (
        (POINTWISE_NAMES, OpKind.POINTWISE),
        (REDUCTION_NAMES, OpKind.REDUCTION),
        (MATMUL_NAMES, OpKind.MATMUL),
        (CONV_NAMES, OpKind.CONV),
        (ATTENTION_NAMES, OpKind.ATTENTION),
        (VIEW_NAMES, OpKind.VIEW),
    ):
        if name in names:
            return kind
    return OpKind.OTHER


def _value(node: object) -> object:
    return node.meta.get("example_value") if isinstance(node, fx.Node) else node


def example_tensor(node: object) -> torch.Tensor | None:
    """The tensor a traced node computed on the example inputs; None where it is no tensor."""
    value = node.meta.get("example_value") if isinstance(node, fx.Node) else None
    return value if isinstance(value, torch.Tensor) else None


def _tensor_args(node: fx.Node) -> list[torch.Tensor]:
    values = [_value(a) for a in (*node.args, *node.kwargs.values())]
    return [v for v in values if isinstance(v, torch.Tensor)]


def _refine(name: str, kind: OpKind, node: fx.Node) -> OpKind:
    """Corrections that depend on arguments or shapes rather than on the op's name alone."""
    out = node.meta.get("example_value")
    if isinstance(out, tuple | list) and name in TUPLE_REDUCTIONS and all(
            isinstance(o, torch.Tensor) for o in out):
        return OpKind.REDUCTION  # its users pick the results with getitem, in the region
    if not isinstance(out, torch.Tensor):
        # Other tuple-returning forms and scalar results stay with PyTorch.
        return OpKind.VIEW if kind is OpKind.VIEW else OpKind.OTHER
    if name == "to" or name == "type_as":
        ins = _tensor_args(node)
        same_place = bool(ins) and ins[0].device == out.device and ins[0].shape == out.shape
        if not same_place:
            return OpKind.OTHER
        return OpKind.VIEW if ins[0].dtype == out.dtype else OpKind.POINTWISE
    if kind is OpKind.POINTWISE and not _tensor_args(node):
        return OpKind.OTHER  # arithmetic on Python scalars only
    if name.endswith("dropout") and _training_flag(node):
        return OpKind.OTHER  # random: not a deterministic site
    if name == "batch_norm":
        # Inference mode is a per-channel affine map, elementwise, and so it fuses into a
        # conv's epilogue. Training mode normalizes by the batch's statistics, a reduction;
        # with running statistics it also updates them in place, which stays with PyTorch.
        if not _training_flag(node):
            return OpKind.POINTWISE
        return OpKind.OTHER if _has_running_stats(node) else OpKind.REDUCTION
    return kind


def _has_running_stats(node: fx.Node) -> bool:
    stats = [node.kwargs.get(k) for k in ("running_mean", "running_var")] + list(node.args[1:3])
    return any(isinstance(s, fx.Node) for s in stats)


def _training_flag(node: fx.Node) -> bool:
    if "training" in node.kwargs:
        return bool(node.kwargs["training"])
    positions = {"batch_norm": 5}
    name = function_name(node.target) or str(node.target)
    index = positions.get(name, 2)
    return len(node.args) > index and bool(node.args[index])


def op_info(node: fx.Node) -> OpInfo:
    """Classify one captured node (`call_function` or `call_method`)."""
    if node.op == "call_function":
        name = function_name(node.target)
        inplace = (node.target in INPLACE_OPERATORS or node.target is operator.setitem
                   or bool(node.kwargs.get("inplace", False)))
        if name is None:
            return OpInfo(str(getattr(node.target, "__name__", node.target)), OpKind.OTHER, False)
        if name.endswith("_") and not name.startswith("_"):
            name, inplace = name[:-1], True
    elif node.op == "call_method":
        name = str(node.target)
        inplace = name.endswith("_") and not name.startswith("_")
        if inplace:
            name = name[:-1]
    else:
        return OpInfo(node.op, OpKind.OTHER, False)
    kind = _refine(name, _kind_of_name(name), node)
    return OpInfo(name, kind, inplace)


def out_of_place(node: fx.Node) -> None:
    """Rewrite an in-place node into its out-of-place twin (the caller checked it is safe)."""
    if node.op == "call_method":
        if str(node.target).endswith("_"):
            node.target = str(node.target)[:-1]
    elif node.target in INPLACE_OPERATORS:
        node.target = INPLACE_OPERATORS[node.target]
    elif getattr(node.target, "__name__", "").endswith("_"):
        name = node.target.__name__[:-1]
        for _, home in _FUNCTION_HOMES:
            if callable(getattr(home, name, None)):
                node.target = getattr(home, name)
                break
        else:
            raise ValueError(f"no out-of-place form of {node.target}")
    if node.kwargs.get("inplace", False):
        node.kwargs = {**node.kwargs, "inplace": False}


def is_factory(node: fx.Node) -> bool:
    """A tensor factory whose value depends on its arguments alone (the receiver of `new_ones`
    lends only its device)."""
    if node.op not in ("call_function", "call_method") or \
            not isinstance(node.meta.get("example_value"), torch.Tensor):
        return False
    name, tensors, kwargs = op_info(node).name, node.all_input_nodes, node.kwargs
    if name not in FACTORY_NAMES:
        return False
    if name.startswith("new_"):
        return tensors == [node.args[0]] and set(kwargs) <= {"dtype", "fill_value"}
    return (not tensors and set(kwargs) <= _FACTORY_KWARGS and not kwargs.get("requires_grad")
            and kwargs.get("layout") in (None, torch.strided) and not kwargs.get("pin_memory"))


def make_relative(node: fx.Node, receiver: fx.Node) -> None:
    """Rewrite a factory (`is_factory`) into `receiver.new_*(shape, ..., dtype=...)`: the same
    tensor, on the receiver's device (the caller checked it is the factory's), so that a site
    problem holding it names no device and runs wherever its inputs are."""
    name = op_info(node).name.removeprefix("new_")
    value = node.meta["example_value"]
    fill = ()
    if name == "full":
        given = node.args[2 if node.op == "call_method" else 1:]
        fill = (given[0] if given else node.kwargs["fill_value"],)
    node.op, node.target = "call_method", f"new_{name}"
    node.args = (receiver, tuple(value.shape), *fill)
    node.kwargs = {"dtype": value.dtype}


def reduced_dims(node: fx.Node) -> tuple[int, ...] | None:
    """The dimensions a reduction node reduces, counted from 0; None when it names none (a
    reduction of everything) or its input is not a tensor of known shape."""
    source = node.args[0] if node.args else node.kwargs.get("input")
    dim = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim")
    value = example_tensor(source)
    if value is None or dim is None:
        return None
    dims = dim if isinstance(dim, tuple | list) else (dim,)
    if not all(isinstance(d, int) for d in dims):
        return None
    return tuple(sorted({d % max(value.dim(), 1) for d in dims}))
