"""The compiler's Triton backend: a planned kernel and its schedule written as Triton kernels and
the `ModelNew` that launches them.

Reductions of one level over one loop share that loop (a norm's mean and variance read each value
once). A persistent kernel reduces whole tiles; a looped one keeps one accumulator a lane and
folds the lanes after the loop; the variance then takes sums shifted by the loop's first value,
which keeps it exact without a second pass and gives a mean beside it too. With splits
(`Schedule.splits`), each reduction level is a launch whose programs store their share's partial
results, and the next launch combines them; the last one stores the outputs.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from generators.compiler.emit import unread_dropped
from generators.compiler.index import Expr, substitute
from generators.compiler.launches import (
    Slot,
    levels_of,
    neutral_kind,
    slots,
    split_launches,
    workspace_slots,
)
from generators.compiler.plan import Kernel, Reduction, variance_means
from generators.compiler.schedule import Schedule
from generators.triton.expressions import tl_dtype
from generators.triton.hoist import invariants_hoisted
from generators.triton.values import ValueWriter

NEUTRAL = {"sum": "0.0", "mean": "0.0", "prod": "1.0", "amax": "float('-inf')",
           "amin": "float('inf')", "argmax": "float('-inf')", "argmin": "float('inf')"}
# A value bound alone on its line.
_ASSIGNMENT = re.compile(r"^\s*(\w+) = [^=]")
_EXTREME = {"amax": ("tl.maximum", "tl.max"), "amin": ("tl.minimum", "tl.min")}


def _neutral(reduction: Reduction, slot: Slot) -> str:
    """What an accumulator starts from."""
    kind = neutral_kind(reduction, slot)
    return "0" if kind is None else NEUTRAL[kind]


def _rescale(peak: str, top: str) -> str:
    """exp(peak - top), one where they are equal (an online sum's scale to a new max)."""
    return f"tl.where({peak} == {top}, 1.0, tl.exp({peak} - {top}))"


class KernelWriter(ValueWriter):
    """One launch: with split loops, `phase` L below the levels computes level L's partial
    results and the last phase the outputs; unsplit, the only phase does everything."""

    def __init__(self, kernel: Kernel, schedule: Schedule, phase: int) -> None:
        super().__init__(kernel)
        self.schedule, self.phase, self.levels = schedule, phase, levels_of(kernel)
        self.splits = schedule.split_count(kernel)
        self.persistent = schedule.persistent(kernel)
        self.workspaces = workspace_slots(kernel, schedule)
        self.rows = ""

    # Loops over columns.
    def columns(self, size: int, symbols: list[str], body: Callable[[], None]) -> None:
        """`body()` over this program's share of `size` columns, BLOCK_COLUMNS at a time, with
        `symbols` bound to each block's coordinates and the masks set. One block when the
        kernel is persistent: the values it computes stay for what comes after."""
        share = -(-size // self.splits)
        chunk = -(-share // self.schedule.block_columns)  # blocks a program walks
        insert_at, depth = len(self.lines), self.depth
        saved_memo = dict(self.memo)
        self.carries, self.after = [], []
        start = f"tl.program_id(1) * {chunk * self.schedule.block_columns}"
        if not self.persistent:
            step = self.name("step")
            self.line(f"for {step} in range({chunk}):")
            self.depth += 1
            start = f"{start} + {step} * BLOCK_COLUMNS"
        base = "tl.arange(0, BLOCK_COLUMNS)[None, :]" + (".to(tl.int64)" if self.wide else "")
        cols = self.let(f"{start} + {base}", "cols")
        column_mask = self.let(f"{cols} < {size}", "cmask")
        self.masks.update(column=column_mask,
                          both=self.let(f"{self.masks['row']} & {column_mask}", "mask"))
        self.counters(cols, symbols)
        body()
        for text in self.after:
            self.line(text)
        self.lines[insert_at:insert_at] = ["    " * depth + c for c in self.carries]
        if not self.persistent:
            self.depth -= 1
            self.memo = saved_memo

    # Reductions.
    def level(self, reductions: list[Reduction]) -> None:
        """Reductions of one level, one loop for each space they walk."""
        spaces: dict[tuple[str, ...], list[Reduction]] = {}
        for reduction in reductions:
            spaces.setdefault(reduction.loop, []).append(reduction)
        for group in spaces.values():
            self.group(group)

    def group(self, reductions: list[Reduction]) -> None:
        """The accumulators of reductions walking one loop, filled in one pass. A mean beside a
        variance of the same values, in a kernel that folds its rows itself, has no accumulator
        of its own: a looped kernel's is the variance's shift plus its shifted sum over the
        count, a persistent kernel's the mean its variance's first pass takes."""
        means = {} if self.splits > 1 else variance_means(reductions)
        group = [r for r in reductions if r.index not in means]
        accumulators: dict[Slot, str] = {}
        shifts: dict[int, str] = {}
        for reduction in group:
            if reduction.node.kind == "var" and not self.persistent:
                zero = {s: Expr() for s in reduction.loop}
                first = tuple(substitute(c, zero) for c in reduction.source_coords())
                shifts[reduction.index] = self.value(reduction.node.source, first)
            for slot in slots(reduction):
                accumulators[slot] = self.let(f"tl.full([BLOCK_ROWS, BLOCK_COLUMNS], "
                                              f"{_neutral(reduction, slot)}, "
                                              f"{tl_dtype(slot.dtype)})", "acc")

        def body() -> None:
            for reduction in group:
                # An online sum reads its max's source: the max's result is not known yet.
                source = (reduction.online_of or reduction).node.source
                value = self.value(source, tuple(reduction.source_coords()))
                self.accumulate(reduction, value, accumulators, shifts.get(reduction.index))

        self.columns(group[0].size, list(group[0].walked), body)
        folded: dict[int, dict[str, str]] = {}
        for reduction in group:
            totals = self.fold(reduction, {s.name: accumulators[s] for s in slots(reduction)})
            folded[reduction.index] = totals
            if self.splits > 1:
                self.store_partials(reduction, totals)
            else:
                self.finish(reduction, totals)
        for mean in (r for r in reductions if r.index in means):
            var = means[mean.index]
            self.reduced[(id(mean.node), mean.coords)] = folded[var.index]["mean"] \
                if self.persistent else self.let(
                    f"{shifts[var.index]} + {folded[var.index]['shifted']} / "
                    f"{float(var.size)!r}", "r")

    def accumulate(self, reduction: Reduction, value: str, acc: dict[Slot, str],
                   shift: str | None) -> None:
        kind, mask = reduction.node.kind, self.masks["both"]
        slot = {s.name: acc[s] for s in slots(reduction)}
        if reduction.online_of is not None:
            # The max so far and the sum of exp(x - it), rescaled as the max grows; a value
            # at the max counts one, so that maxima of -inf never meet exp(-inf + inf).
            peak, total = slot["peak"], slot["total"]
            kept = self.let(f"tl.where({mask}, {value}, float('-inf'))")
            top = self.let(f"tl.maximum({peak}, {kept}, propagate_nan=tl.PropagateNan.ALL)")
            self.line(f"{total} = {total} * {_rescale(peak, top)} + tl.where({mask}, "
                      f"{_rescale(kept, top)}, 0.0)")
            self.line(f"{peak} = {top}")
        elif kind in ("argmax", "argmin"):
            better = ">" if kind == "argmax" else "<"
            best, at = slot["best"], slot["at"]
            kept = self.let(f"tl.where({mask}, {value}, {NEUTRAL[kind]})")
            take = self.let(f"({kept} {better} {best}) | (({kept} != {kept}) & "
                            f"({best} == {best}))")
            self.line(f"{best} = tl.where({take}, {kept}, {best})")
            self.line(f"{at} = tl.where({take}, {self.bound[reduction.loop[0]]}, {at})")
        elif kind == "var":
            if shift is None:  # persistent: the tile is the whole row; fold does two passes
                self.line(f"{slot['shifted']} = tl.where({mask}, {value}, 0.0)")
                return
            deviation = self.let(f"tl.where({mask}, {value} - {shift}, 0.0)")
            self.line(f"{slot['shifted']} = {slot['shifted']} + {deviation}")
            self.line(f"{slot['squares']} = {slot['squares']} + {deviation} * {deviation}")
        else:
            # In the accumulator's own type: a loop-carried value may not change type (a
            # count of a comparison would turn int64 into fp32 through `where`'s 0.0).
            dtype = next(s.dtype for s in slots(reduction) if s.name == "total")
            kept = self.let(f"tl.where({mask}, {value}, {NEUTRAL[kind]}).to({tl_dtype(dtype)})")
            total = slot["total"]
            if kind in _EXTREME:
                self.line(f"{total} = {_EXTREME[kind][0]}({total}, {kept}, "
                          "propagate_nan=tl.PropagateNan.ALL)")
            elif kind == "prod":
                self.line(f"{total} = {total} * {kept}")
            else:
                self.line(f"{total} = {total} + {kept}")

    def fold(self, reduction: Reduction, slot: dict[str, str]) -> dict[str, str]:
        """The accumulators' lanes folded into [rows, 1] totals."""
        kind = reduction.node.kind
        if reduction.online_of is not None:
            peak = self.let(self.fold_one("amax", "peak", slot["peak"]))
            total = self.let(f"tl.sum({slot['total']} * {_rescale(slot['peak'], peak)}, "
                             "axis=1)[:, None]")
            return {"peak": peak, "total": total}
        if kind in ("argmax", "argmin"):
            best, at = self.arg_fold(kind, slot["best"], slot["at"], reduction.size)
            return {"best": best, "at": at}
        if kind == "var" and self.persistent:
            # The whole row is in the tile: its mean first, then the squared deviations.
            tile, n = slot["shifted"], reduction.size
            mean = self.let(f"tl.sum({tile}, axis=1)[:, None] / {float(n)!r}")
            deviation = self.let(f"tl.where({self.masks['both']}, {tile} - {mean}, 0.0)")
            squares = self.let(f"tl.sum({deviation} * {deviation}, axis=1)[:, None]")
            return {"shifted": self.let(f"tl.zeros_like({squares})"), "squares": squares,
                    "mean": mean}
        return {name: self.let(self.fold_one(kind, name, tile)) for name, tile in slot.items()}

    @staticmethod
    def fold_one(kind: str, name: str, tile: str) -> str:
        if kind in _EXTREME:
            return f"{_EXTREME[kind][1]}({tile}, axis=1)[:, None]"
        if kind == "prod":
            return f"tl.reduce({tile}, 1, _times)[:, None]"
        return f"tl.sum({tile}, axis=1)[:, None]"

    def arg_fold(self, kind: str, best: str, at: str, size: int) -> tuple[str, str]:
        """The best value over the lanes and its first index; NaN counts as the best."""
        nan = self.let(f"tl.max(({best} != {best}).to(tl.int32), axis=1)[:, None] > 0")
        top = self.let(f"{_EXTREME['amax' if kind == 'argmax' else 'amin'][1]}(tl.where("
                       f"{best} != {best}, {NEUTRAL[kind]}, {best}), axis=1)[:, None]")
        chosen = self.let(f"tl.where({nan}, {best} != {best}, {best} == {top})")
        index = self.let(f"tl.min(tl.where({chosen}, {at}, {size}), axis=1)[:, None]")
        value = self.let(f"tl.where({nan}, float('nan'), {top})")
        return value, index

    def finish(self, reduction: Reduction, totals: dict[str, str]) -> None:
        node, n = reduction.node, reduction.size
        if reduction.online_of is not None:
            # NaN where the max is +inf, as PyTorch's exp(inf - inf) makes its sum: counting a
            # value at the max as one would hide it.
            result = self.let(f"tl.where({totals['peak']} == float('inf'), float('nan'), "
                              f"{totals['total']})")
        elif node.kind in ("argmax", "argmin"):
            result = totals["at"]
        elif node.kind == "var":
            s, q = totals["shifted"], totals["squares"]
            result = self.let(f"({q} - {s} * {s} / {float(n)!r}) / "
                              f"{float(max(n - node.correction, 0.0))!r}", "r")
        elif node.kind == "mean":
            result = self.let(f"{totals['total']} / {float(n)!r}", "r")
        else:
            result = totals["total"]
        self.reduced[(id(node), reduction.coords)] = result

    # Split loops: partial results through workspaces.
    def workspace(self, slot: Slot) -> str:
        return f"ws{self.workspaces.index(slot)}"

    def store_partials(self, reduction: Reduction, totals: dict[str, str]) -> None:
        for slot in slots(reduction):
            self.line(f"tl.store({self.workspace(slot)} + {self.rows} * {self.splits} + "
                      f"tl.program_id(1), {totals[slot.name]}, mask={self.masks['row']})")

    def combine(self, reduction: Reduction) -> None:
        """A reduction of an earlier launch: its partial results folded across the splits."""
        width = 1 << (self.splits - 1).bit_length()
        part = self.let(f"tl.arange(0, {width})[None, :]", "part")
        mask = self.let(f"{self.masks['row']} & ({part} < {self.splits})", "pmask")
        tiles = {}
        for slot in slots(reduction):
            tiles[slot.name] = self.let(
                f"tl.load({self.workspace(slot)} + {self.rows} * {self.splits} + {part}, "
                f"mask={mask}, other={_neutral(reduction, slot)})", "part")
        saved, self.masks["both"] = self.masks.get("both"), mask
        totals = self.fold(reduction, tiles) if reduction.node.kind != "var" else {
            name: self.let(f"tl.sum({tile}, axis=1)[:, None]") for name, tile in tiles.items()}
        self.masks["both"] = saved
        self.finish(reduction, totals)

    # The launch.
    def body(self) -> list[str]:
        kernel = self.kernel
        index = ".to(tl.int64)" if self.wide else ""
        block = "tl.program_id(0)"
        passes_at = None
        if self.schedule.resident_per_sm:
            # PASSES (the launch's blocks over its programs) is a constant: a loop's bounds must
            # be, under the interpreter. A last pass past the blocks is masked off by its rows.
            # A persistent pass has no loop inside it, so the next block's loads can be issued
            # while this one's outputs are stored (the software pipeliner's two stages).
            each = self.name("each")
            passes = "tl.range(PASSES, num_stages=2)" if self.persistent else "range(PASSES)"
            passes_at = len(self.lines)
            self.line(f"for {each} in {passes}:")
            self.depth += 1
            block = self.let(f"tl.program_id(0) + {each} * tl.num_programs(0)", "block", "index")
        self.rows = self.let(f"{block}{index} * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)[:, None]",
                             "rows")
        self.masks["row"] = self.let(f"{self.rows} < {kernel.row_count}", "rmask")
        self.masks["both"] = self.masks["row"]
        self.counters(self.rows, [kernel.symbols[d] for d in kernel.rows])
        split = split_launches(kernel, self.schedule)
        final = not split or self.phase == self.levels
        for level in range(self.levels if final else self.phase + 1):
            reductions = [r for r in kernel.reductions if r.level == level]
            if split and (level < self.phase or final):
                for reduction in reductions:
                    self.combine(reduction)
            else:
                self.level(reductions)
        if final:
            self.outputs()
        lines = self.lines if passes_at is None else invariants_hoisted(self.lines, passes_at)
        return unread_dropped(lines, _ASSIGNMENT, "#")

    def outputs(self) -> None:
        kernel = self.kernel
        if kernel.full:
            self.columns(kernel.column_count, [kernel.symbols[d] for d in kernel.columns],
                         lambda: self.store(kernel.full, "both"))
        if kernel.per_row:
            self.masks["both"] = self.masks["row"]
            if self.splits > 1:  # one program of each row stores the row's own outputs
                self.masks["row"] = self.let(f"{self.masks['row']} & (tl.program_id(1) == 0)")
            self.store(kernel.per_row, "row")

    def store(self, outputs: tuple[int, ...], mask: str) -> None:
        for i in outputs:
            output = self.kernel.graph.outputs[i]
            value = self.value(output, tuple(self.kernel.output_coords(i)))
            # An output of the rows' size lies in row order: its offset is the row counter.
            offset = (self.render(self.kernel.output_offset(i)) if mask == "both" else self.rows)
            self.line(f"tl.store(out{i} + {offset}, ({value}).to({tl_dtype(output.dtype)}), "
                      f"mask={self.masks[mask]})")

