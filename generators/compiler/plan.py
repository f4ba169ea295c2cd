"""How a site's IR becomes one kernel: the loop domain, its row and column dimensions, and the
reductions each row needs, in the order they depend on each other.

A kernel loops over a domain, the shape of one of the site's values (a reduction's source, or an
output), in rows and columns. Row dimensions are those the reductions' results depend on: each
program takes a block of rows, computes every reduction of its rows (each a loop over the
reduced dimensions), then walks the columns to compute and store the outputs of the domain's
size. Outputs of the rows' size (a reduction's own result, say) are stored once per row. Which
dimensions are rows falls out of the index expressions (`generators.compiler.index`): they are
the loop counters the reductions' coordinates use, once views are seen through. A domain where
that does not come out clean (a reduction inside another's loop, an output of neither size, a
scan with more than its own dimension for columns) is refused, and the next tried.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from generators.compiler.index import Expr, Ranges, linearize, reshape
from generators.compiler.ir import (
    Cast,
    Constant,
    Coordinate,
    Elementwise,
    Gather,
    Graph,
    Input,
    Missing,
    Reduce,
    Scan,
    Value,
    View,
    broadcast_coords,
)
from generators.site_graph import Unsupported

Coords = tuple[Expr, ...]
# The shortest rows an elementwise kernel takes for its broadcast inputs (`_broadcast_rows`):
# a warp's columns.
MIN_ROW_COLUMNS = 32


@dataclass(eq=False)
class Reduction:
    """One reduction a row needs: `node` at result coordinates `coords` (row counters only),
    looping over `loop`, one counter per reduced dimension."""

    node: Reduce
    coords: Coords
    loop: tuple[str, ...]
    index: int
    needs: set[tuple[int, Coords]] = field(default_factory=set)  # reductions its source reads
    level: int = 0  # 0 for one that reads no other reduction, else 1 + theirs
    # A sum of exp(x - max(x)) (a softmax's) computed in its max's walk, the sum rescaled as the
    # max grows, so that the row is walked once for both: that max's reduction; else None.
    online_of: Reduction | None = None
    # The loop's counters in the order the walk goes, outermost first, where it is not the
    # reduced dimensions' own (`_walk_in_memory_order`); `loop` stays one counter a dimension.
    walk: tuple[str, ...] = ()

    @property
    def walked(self) -> tuple[str, ...]:
        return self.walk or self.loop

    @property
    def size(self) -> int:
        return math.prod(self.node.reduced_shape)

    def source_coords(self) -> list[Expr]:
        return self.node.source_coords(list(self.coords), [Expr.of(s) for s in self.loop])


def variance_means(reductions: list[Reduction]) -> dict[int, Reduction]:
    """Means beside a variance of the same values over the same loop (a norm's `var_mean`), by
    index, each with that variance: its shifted sum gives the mean too (shift + sum / count)."""
    return {mean.index: var for mean in reductions for var in reductions
            if mean.node.kind == "mean" and var.node.kind == "var" and mean.online_of is None
            and mean.node.source is var.node.source and mean.loop == var.loop
            and mean.coords == var.coords}


@dataclass
class Kernel:
    graph: Graph
    domain: tuple[int, ...]
    symbols: tuple[str, ...]  # one loop counter per domain dimension
    rows: tuple[int, ...]  # the domain dimensions that are rows
    columns: tuple[int, ...]  # the rest
    full: tuple[int, ...]  # outputs of the domain's size
    per_row: tuple[int, ...]  # outputs of the rows' size
    reductions: list[Reduction]
    scan_dim: int | None
    ranges: Ranges
    sizes: dict[str, int] = field(default_factory=dict)  # every counter's extent
    loads: list[tuple[Input, Coords]] = field(default_factory=list)  # every input read

    def rows_contiguous(self) -> bool:
        """Whether the largest input lies with the rows side by side in memory (a reduction
        over a leading dimension): a program then takes many rows and few columns a step."""
        if not self.loads:
            return False
        largest, coords = max(self.loads, key=lambda load: load[0].numel)
        row_symbols = {self.symbols[d] for d in self.rows}
        for coord, stride in zip(coords, largest.stride, strict=True):
            if stride == 1 and coord.terms:
                return bool(coord.symbols() & row_symbols) and not (
                    coord.symbols() - row_symbols)
        return False

    def walks_rows_twice(self) -> bool:
        """Whether a looped program walks each row more than once: reductions of more than one
        level (a softmax's sum after its max), or outputs of the domain's size after a reduction
        (a norm's outputs after its statistics)."""
        levels = {r.level for r in self.reductions}
        return len(levels) > 1 or bool(self.reductions and self.full)

    @property
    def longest_loop(self) -> int:
        """The most values a row's loops walk: its reductions' and its columns'."""
        return max([r.size for r in self.reductions] + [self.column_count, 1])

    @property
    def row_count(self) -> int:
        return math.prod(self.domain[d] for d in self.rows)

    @property
    def column_count(self) -> int:
        return math.prod(self.domain[d] for d in self.columns)

    def output_coords(self, index: int) -> list[Expr]:
        """An output's coordinates in terms of the domain's counters (or the rows' alone)."""
        value = self.graph.outputs[index]
        if index in self.full:
            return reshape([Expr.of(s) for s in self.symbols], self.domain, value.shape,
                           self.ranges)
        row_shape = tuple(self.domain[d] for d in self.rows)
        return reshape([Expr.of(self.symbols[d]) for d in self.rows], row_shape, value.shape,
                       self.ranges)

    def output_offset(self, index: int) -> Expr:
        """Where an output element goes in its contiguous tensor."""
        if index in self.full:
            return linearize([Expr.of(s) for s in self.symbols], self.domain)
        return linearize([Expr.of(self.symbols[d]) for d in self.rows],
                         tuple(self.domain[d] for d in self.rows))


class _Survey:
    """Walks values from given coordinates as a kernel would compute them, collecting the
    reductions and scans met and the counters each depends on."""

    def __init__(self, domain: tuple[int, ...], symbols: tuple[str, ...],
                 sizes: dict[str, int]) -> None:
        self.domain, self.symbols = domain, symbols
        self.sizes = sizes
        self.ranges = Ranges(sizes)
        self.reductions: dict[tuple[int, Coords], Reduction] = {}
        self.scans: list[tuple[Scan, Coords]] = []
        self.needs: dict[tuple[int, Coords], frozenset[tuple[int, Coords]]] = {}
        self.loads: list[tuple[Input, Coords]] = []
        self.loops: dict[tuple[Coords, tuple[int, ...]], tuple[str, ...]] = {}

    def fresh(self, prefix: str, size: int) -> str:
        name = f"{prefix}{len(self.sizes)}"
        self.sizes[name] = size
        self.ranges = Ranges(self.sizes)
        return name

    def loop_counters(self, node: Reduce, coords: Coords) -> tuple[str, ...]:
        """A reduction over the domain itself, kept dimensions at their own counters, loops
        over the domain's counters of its reduced dimensions: a persistent kernel then reads
        each value once for the reduction and the outputs. Any other gets counters of its own."""
        if tuple(node.source.shape) == self.domain:
            kept = Reduction(node, coords, tuple(self.symbols[d] for d in node.dims), -1)
            if kept.source_coords() == [Expr.of(s) for s in self.symbols]:
                return kept.loop
        # Reductions over one space for one row share their counters, so that one loop
        # computes them all (a norm's mean and variance) and loads each value once.
        space = (coords, node.reduced_shape)
        if space not in self.loops:
            self.loops[space] = tuple(self.fresh("l", size) for size in node.reduced_shape)
        return self.loops[space]

    def visit(self, value: Value, coords: Coords) -> frozenset[tuple[int, Coords]]:
        """Walk `value` at `coords`; the reductions (by key) it reads, directly or not."""
        key = (id(value), coords)
        if key not in self.needs:
            self.needs[key] = self._walk(value, coords)
        return self.needs[key]

    def _walk(self, value: Value, coords: Coords) -> frozenset[tuple[int, Coords]]:
        if isinstance(value, Input):
            self.loads.append((value, coords))
            return frozenset()
        if isinstance(value, Constant | Coordinate):
            return frozenset()
        if isinstance(value, Elementwise | Cast):
            return frozenset().union(*(self.visit(operand, tuple(broadcast_coords(
                list(coords), value.shape, operand.shape))) for operand in value.operands()))
        if isinstance(value, View):
            return self.visit(value.source, tuple(value.source_coords(list(coords),
                                                                      self.ranges)))
        if isinstance(value, Gather):
            picked = self.fresh("g", value.source.shape[value.dim])
            source = list(coords)
            source[value.dim] = Expr.of(picked)
            return self.visit(value.index, coords) | self.visit(value.source, tuple(source))
        if isinstance(value, Reduce):
            reduction = Reduction(value, coords, self.loop_counters(value, coords), -1)
            # Its source first: the reductions it needs come before it.
            reduction.needs = set(self.visit(value.source, tuple(reduction.source_coords())))
            reduction.index = len(self.reductions)
            reduction.level = 1 + max((self.reductions[k].level for k in reduction.needs),
                                      default=-1)
            self.reductions[(id(value), coords)] = reduction
            return frozenset({(id(value), coords)})
        if isinstance(value, Scan):
            self.scans.append((value, coords))
            return self.visit(value.source, coords)
        if isinstance(value, Missing):
            raise Unsupported(f"{value.why} (the compiler does not compute it)")
        raise Unsupported(f"no kernel computes a {type(value).__name__}")


def _try(graph: Graph, domain: tuple[int, ...]) -> Kernel | str:
    """The kernel over `domain`, or why there is none."""
    symbols = tuple(f"d{i}" for i in range(len(domain)))
    sizes = dict(zip(symbols, domain, strict=True))
    survey = _Survey(domain, symbols, sizes)
    numel = math.prod(domain)
    full = tuple(i for i, o in enumerate(graph.outputs) if o.numel == numel)
    for i in full:
        coords = reshape([Expr.of(s) for s in symbols], domain, graph.outputs[i].shape,
                         survey.ranges)
        survey.visit(graph.outputs[i], tuple(coords))
    used: set[str] = set()
    for reduction in survey.reductions.values():
        for coord in reduction.coords:
            used |= coord.symbols()
    scan_dim = None
    for scan, coords in survey.scans:
        along = coords[scan.dim].symbols()
        if len(along) != 1 or next(iter(along)) not in symbols:
            return f"{scan.kind} along a dimension the domain does not walk as one counter"
        scan_dim = symbols.index(next(iter(along)))
        for d, coord in enumerate(coords):
            if d != scan.dim:
                used |= coord.symbols()
    rows = tuple(d for d, s in enumerate(symbols) if s in used)
    if not survey.reductions and scan_dim is None:
        rows = _broadcast_rows(survey.loads, symbols, domain)
    columns = tuple(d for d in range(len(domain)) if d not in rows)
    if scan_dim is not None and columns != (scan_dim,):
        return "a scan with other column dimensions than its own"
    row_numel = math.prod(domain[d] for d in rows)
    per_row = tuple(i for i, o in enumerate(graph.outputs)
                    if (i not in full or not columns) and o.numel == row_numel)
    if not columns:
        full = ()  # every dimension a row one: the domain's outputs are stored per row
    if len(full) + len(per_row) < len(graph.outputs):
        return "an output of neither the domain's nor the rows' size"
    kernel = Kernel(graph, domain, symbols, rows, columns, full, per_row, [], scan_dim,
                    survey.ranges, survey.sizes)
    for i in per_row:
        survey.visit(graph.outputs[i], tuple(kernel.output_coords(i)))
    row_symbols = {symbols[d] for d in rows}
    for reduction in survey.reductions.values():
        if any(not coord.symbols() <= row_symbols for coord in reduction.coords):
            return "a reduction inside another reduction's loop"
        if set(reduction.loop) & row_symbols:
            # Looping over the domain's own counter of a dimension another reduction's rows
            # keep (a logsumexp over the channels of a group norm's output, each channel a
            # group): inside that loop, the other's results would be the row's, not the loop's.
            return "a reduction loops over a dimension that another reduction's rows keep"
    kernel.reductions = sorted(survey.reductions.values(), key=lambda r: r.index)
    kernel.ranges, kernel.sizes, kernel.loads = survey.ranges, survey.sizes, survey.loads
    if kernel.scan_dim is None:
        _walk_in_memory_order(kernel)
    if kernel.scan_dim is None and not kernel.rows_contiguous():
        _online_sums(kernel)
    return kernel


def _broadcast_rows(loads: list[tuple[Input, Coords]], symbols: tuple[str, ...],
                    domain: tuple[int, ...]) -> tuple[int, ...]:
    """An elementwise kernel's row dimensions: the leading ones its broadcast inputs vary along
    (a convolution's channels, for per-channel parameters), so that those inputs, and what is
    computed from them alone, are loaded and computed once a row and not once an element.
    None where a broadcast input varies along the last dimension (a bias over columns), or
    where the rows would be shorter than MIN_ROW_COLUMNS. An input of the domain's size may lie
    with the rows innermost (a convolution's channels-last output): the rows of a tile are
    then read side by side and its columns written along the output."""
    every = set(symbols)
    spans = [set().union(*(c.symbols() for c in coords)) & every for _, coords in loads]
    broadcast = set().union(*(used for used in spans if used != every))
    if not broadcast:
        return ()
    rows = tuple(range(1 + max(symbols.index(s) for s in broadcast)))
    if math.prod(domain[len(rows):]) < MIN_ROW_COLUMNS:
        return ()
    return rows


def _linear_strides(value: Input, coords: Coords) -> dict[str, int]:
    """How far apart in memory `value`'s elements lie along each counter its coordinates use
    linearly (those under a division or remainder are left out)."""
    address = value.offset(coords)
    bent = set().union(*(atom[1].symbols() for atom, _ in address.terms
                         if not isinstance(atom, str)))
    return {atom: abs(coef) for atom, coef in address.terms
            if isinstance(atom, str) and atom not in bent}


def memory_order(kernel: Kernel, symbols: tuple[str, ...]) -> tuple[str, ...]:
    """`symbols`, the counters of one walk, outermost first as the largest input read along all
    of them lies in memory; as they are where its layout does not order them plainly (a
    division or remainder, a broadcast, two counters one stride apart)."""
    walked = set(symbols)
    reading = [(value, coords) for value, coords in kernel.loads
               if walked <= set().union(*(c.symbols() for c in coords))]
    if len(symbols) < 2 or not reading:
        return symbols
    strides = _linear_strides(*max(reading, key=lambda load: load[0].numel))
    if not walked <= strides.keys() or len({strides[s] for s in symbols}) < len(symbols):
        return symbols
    return tuple(sorted(symbols, key=lambda s: -strides[s]))


def _walk_in_memory_order(kernel: Kernel) -> None:
    """Every walk in the order its largest input lies in memory: a channels-last tensor's
    channels innermost, where the view gives them outermost (a group norm's rows over a
    channels-last convolution's output), so that a warp's loads are one run and not a value
    every few hundred bytes. The columns and the reductions looping over the domain's own
    counters move together: a persistent kernel's walks must lay a row out alike, to reuse its
    values. An argmax or argmin walks one dimension (the first of equal extremes wins in it),
    so its kernel's columns are that one, and nothing moves."""
    columns = tuple(kernel.symbols[d] for d in kernel.columns)
    ordered = memory_order(kernel, columns)
    kernel.columns = tuple(kernel.symbols.index(s) for s in ordered)
    position = {s: ordered.index(s) for s in ordered}
    for reduction in kernel.reductions:
        if set(reduction.loop) <= position.keys():
            reduction.walk = tuple(sorted(reduction.loop, key=position.__getitem__))
        elif not set(reduction.loop) & set(kernel.symbols):
            reduction.walk = memory_order(kernel, reduction.loop)


def _online_sums(kernel: Kernel) -> None:
    """Sums of exp(x - max(x)) over their max's loop (softmax, log-softmax) that no other
    reduction reads: each computed in its max's walk, a level earlier (`Reduction.online_of`)."""
    needed = set().union(*(r.needs for r in kernel.reductions))
    by_key = {(id(r.node), r.coords): r for r in kernel.reductions}
    for reduction in kernel.reductions:
        exp = reduction.node.source
        if (reduction.node.kind != "sum" or (id(reduction.node), reduction.coords) in needed
                or not (isinstance(exp, Elementwise) and exp.op == "exp" and not exp.kwargs
                        and len(exp.args) == 1)):
            continue
        sub = exp.args[0]
        if not (isinstance(sub, Elementwise) and sub.op == "sub" and not sub.kwargs
                and len(sub.args) == 2 and isinstance(sub.args[1], Reduce)):
            continue
        peak = [by_key[k] for k in reduction.needs if k[0] == id(sub.args[1])]
        if (len(reduction.needs) == 1 and len(peak) == 1 and peak[0].node.kind == "amax"
                and peak[0].node.source is sub.args[0] and peak[0].loop == reduction.loop
                and sub.args[0].shape == exp.shape):
            reduction.online_of, reduction.level = peak[0], peak[0].level


def without_online_sums(kernel: Kernel) -> Kernel:
    """`kernel` with each online sum a walk of its own again, after its max's. For schedules
    that keep a row on chip in a block or a cluster, or hold it whole in registers: walking it
    again there costs less than the online sum's exponentials, each waiting on the last value's
    max, and the outputs reuse the sum's (bench/NOTES.md, 2026-12-06 18:14 UTC: 23_Softmax's
    kept cluster in one walk and in two; 2026-12-07 08:22 UTC: softmax 8192² held whole)."""
    if all(r.online_of is None for r in kernel.reductions):
        return kernel
    return replace(kernel, reductions=[
        r if r.online_of is None else replace(r, online_of=None, level=r.online_of.level + 1)
        for r in kernel.reductions])


def candidate_domains(graph: Graph) -> list[tuple[int, ...]]:
    """Reductions' sources first (a norm's view of its groups), then the outputs, largest first."""
    shapes = [v.source.shape for v in graph.values() if isinstance(v, Reduce)]
    shapes += sorted((o.shape for o in graph.outputs), key=lambda s: -math.prod(s))
    unique: list[tuple[int, ...]] = []
    for shape in shapes:
        if shape not in unique:
            unique.append(tuple(shape))
    return unique


def plan(graph: Graph) -> Kernel:
    """The site as one kernel, or Unsupported with why no domain worked."""
    reasons = []
    for domain in candidate_domains(graph):
        found = _try(graph, domain)
        if isinstance(found, Kernel):
            return found
        reasons.append(f"over {domain}: {found}")
    raise Unsupported("no single kernel computes the site: " + "; ".join(reasons))
