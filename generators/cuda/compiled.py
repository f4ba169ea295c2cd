"""The compiler's CUDA backend: a planned kernel and its schedule as CUDA C++ kernels, the second
tier from the same IR and schedule as the Triton one (`generators.triton.compiled`).

A block of `32 * num_warps` threads takes `block_rows` rows; the threads of a row (its lanes)
walk its columns side by side, each keeping scalar accumulators, and fold them when the loop
ends, with warp shuffles and, for rows wider than a warp, shared memory: every lane then holds
the row's result. In a row's walks a lane may take `vector` consecutive columns a step, read and
written as one vector where an input or output lies along them (`generators.cuda.walk_values`).
Where the rows lie side by side in memory (a reduction over a leading
dimension), consecutive threads take consecutive rows instead, so that a warp's loads of one
column are one contiguous run, and a row's lanes, a block's rows apart, fold in shared memory.
The variance keeps sums shifted by the row's first value, which give a mean beside it too.
With splits, each reduction level is a launch whose blocks store their share's partial results,
which the next launch folds, as in the Triton backend.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from generators.compiler.index import Expr, substitute
from generators.compiler.launches import (
    levels_of,
    neutral_kind,
    slots,
    split_launches,
    workspace_slots,
)
from generators.compiler.plan import Kernel, Reduction, variance_means
from generators.compiler.schedule import Schedule
from generators.cuda.row_folds import FUNCTOR, RowFolds, c_type
from generators.cuda.values import element_type, without_unused

NEUTRAL = {"sum": "0.0f", "mean": "0.0f", "prod": "1.0f", "amax": "-INFINITY",
           "amin": "INFINITY", "argmax": "-INFINITY", "argmin": "INFINITY"}
MAX_STEPS = 8
# A walk that keeps its share in shared memory, one block of 1024 threads an SM, needs more loads
# in flight a thread to cover DRAM's latency: a group norm's rows shared by 44 blocks ran fastest
# at 16 steps of the 4, 8 and 16 tried (bench/NOTES.md, 2026-12-06, 12:51-14:22 UTC).
MAX_KEPT_STEPS = 16


class CudaKernelWriter(RowFolds):
    """One launch of a planned kernel (phases as in the Triton backend)."""

    def __init__(self, kernel: Kernel, schedule: Schedule, phase: int) -> None:
        super().__init__(kernel)
        self.schedule, self.phase, self.levels = schedule, phase, levels_of(kernel)
        self.splits = schedule.split_count(kernel)
        self.threads = 32 * schedule.num_warps
        self.rows_per_block = min(schedule.block_rows, self.threads)
        if kernel.scan_dim is not None:
            # A scan runs along one warp's lanes: a row takes at most a warp.
            self.rows_per_block = max(self.rows_per_block, self.threads // 32)
        self.lanes = self.threads // self.rows_per_block
        # Rows side by side in memory: a block's rows on consecutive threads (coalesced loads).
        self.rows_apart = (kernel.scan_dim is None and self.lanes > 1
                           and kernel.rows_contiguous())
        # Vectors a lane takes each pass of a loop (of `vector` columns in a row's walks, of one
        # in the others): the schedule's block of columns shared by a row's lanes, at most
        # MAX_STEPS (MAX_KEPT_STEPS where the rows are kept).
        self.vector = schedule.vector
        most = MAX_KEPT_STEPS if schedule.keep_row else MAX_STEPS
        self.steps = max(1, min(most, schedule.block_columns // (self.lanes * self.vector)))
        self.workspaces = workspace_slots(kernel, schedule)
        # The schedule comes fitted to the kernel (`launches.frame`): a cluster only where a
        # reduction's loops are shared, rows kept only where rows lie apart and no split launch
        # ends a walk.
        self.cluster = schedule.cluster_blocks
        self.exchanges = 0  # a cluster's exchanges of partial results so far
        # A row's blocks of the GPU: its barriers so far, each waiting for all of them again.
        self.grid, self.barriers = schedule.grid_blocks, 0
        # Slots of `fold_space` the folds take: 64 (a value a warp, or an arg fold's pairs),
        # or 32 a value of the largest batch folded together.
        self.fold_slots = 64
        # Rows kept: each lane's values of the full-shape inputs, from the first walk that
        # loads them to the last, in shared memory (a slot a lane a column it walks, so that
        # only the lane that wrote a value reads it: no barrier between walks) or in registers
        # (an array a lane, its walks unrolled whole so that every index is a constant).
        self.keep = schedule.keep_row
        self.registers = self.keep and schedule.held == "registers"
        # Kept walks are those over a row's columns: vectors there if their innermost dimension
        # takes them.
        self.kept_width = self.walk_width([kernel.symbols[d] for d in kernel.columns])
        share = self.share(kernel.column_count, self.kept_width)
        passes = self.steps * self.lanes * self.kept_width
        self.kept_columns = -(-share // passes) * passes  # a row's share, in whole passes
        self.passes = self.kept_columns // passes  # of a kept walk
        self.unrolled_walks = 0  # kept walks in registers so far

    def workspace(self, reduction: Reduction, name: str) -> str:
        found = [j for j, slot in enumerate(self.workspaces)
                 if slot.reduction == reduction.index and slot.name == name]
        return f"ws{found[0]}"

    def parameter_types(self) -> list[str]:
        """The kernel's parameters, as the launch passes them."""
        kernel = self.kernel
        return ([f"const {element_type(v.dtype)}* __restrict__ in{v.index}"
                 for v in kernel.graph.inputs]
                + [f"{element_type(o.dtype)}* __restrict__ out{i}"
                   for i, o in enumerate(kernel.graph.outputs)]
                + [f"{c_type(slot)}* __restrict__ ws{j}"
                   for j, slot in enumerate(self.workspaces)]
                + (["int* __restrict__ arrivals"] if self.grid and self.workspaces else []))

    def walk_width(self, symbols: list[str]) -> int:
        """Columns a lane takes a step in a walk over `symbols`: the schedule's vector where the
        innermost one's extent is a multiple of it, else one."""
        fits = bool(symbols) and self.sizes[symbols[-1]] % self.vector == 0
        return self.vector if fits else 1

    def share(self, size: int, width: int) -> int:
        """A block's share of a row's `size` columns: whole vectors of `width`."""
        each = -(-size // self.splits)
        return -(-each // width) * width

    def columns(self, size: int, symbols: list[str], body: Callable[[], None]) -> None:
        """`body()` for this block's share of `size` columns, the lanes of a row side by side,
        `self.steps` vectors a lane each pass (unrolled, so that their loads are in flight
        together); every lane runs every step (a lane past the end works on the last vector and
        `inside` says so), so that shuffles in the body see them all. A lane takes
        `walk_width(symbols)` consecutive columns a step."""
        kept_walk = tuple(symbols) == tuple(self.kernel.symbols[d] for d in self.kernel.columns)
        width = self.walk_width(symbols)
        share = self.share(size, width)
        if not self.kernel.reductions:  # whole passes: no pass of a share left nearly empty
            share = -(-share // (self.steps * self.lanes)) * self.steps * self.lanes
        start, end = self.name("start"), self.name("end")
        self.line(f"const {self.index} {start} = ({self.index})blockIdx.y * {share};")
        self.line(f"const {self.index} {end} = {start} + {share} < {size} ? {start} + {share} "
                  f": {size};")
        insert_at, saved_memo = len(self.lines), dict(self.memo)
        self.carries, self.after = [], []
        base, step = self.name("base"), self.name("step")
        kept_walk = self.keep and kept_walk
        walk = self.name("walk") if kept_walk and self.registers else ""
        stride = f"{self.steps} * LANES" + (f" * {width}" if width > 1 else "")
        if walk:
            if self.unrolled_walks:
                # Offsets computed again, not carried over from the first walk: carried, they
                # took a register a step across the exchange (bench/NOTES.md, 2026-12-06 20:47).
                letter, opaque = "l" if self.index == "long long" else "r", self.name("start")
                self.line(f"{self.index} {opaque} = {start};")
                self.line(f'asm volatile("" : "+{letter}"({opaque}));')
                start = opaque
            self.unrolled_walks += 1
            # A fixed count of passes, unrolled: the kept arrays' indices are constants.
            self.line("#pragma unroll")
            self.line(f"for (int {walk} = 0; {walk} < {self.passes}; ++{walk}) {{")
            self.line(f"const {self.index} {base} = {start} + ({self.index}){walk} * {stride};")
        else:
            self.line(f"for ({self.index} {base} = {start}; {base} < {end}; "
                      f"{base} += {stride}) {{")
        self.line("#pragma unroll")
        self.line(f"for (int {step} = 0; {step} < {self.steps}; ++{step}) {{")
        self.depth += 1
        lane = f"({step} * LANES + lane) * {width}" if width > 1 else f"{step} * LANES + lane"
        column = first = self.let(f"{base} + {lane}", "col", "index")
        if share * self.splits == size and share % (self.steps * self.lanes * width) == 0:
            # The blocks' shares fill the row in whole passes: no lane is ever past its end.
            clamped, inside = column, "true"
        else:
            inside = self.name("inside")
            self.line(f"const bool {inside} = {column} < {end};")
            clamped = self.let(f"{inside} ? {column} : {end} - {width}", "c", "index")
        self.masks.update(column=inside, both=inside)
        self.counters(clamped, symbols)
        if width > 1:
            # The vector's columns, in a loop unrolled whole; its loads before it, its stores
            # after it, at its first column's counters.
            self.vector_bound, self.before, self.after_vector = dict(self.bound), [], []
            self.walk_symbols = list(symbols)
            before_at, self.vector_lane = len(self.lines), self.name("v")
            self.line("#pragma unroll")
            self.line(f"for (int {self.vector_lane} = 0; {self.vector_lane} < {width}; "
                      f"++{self.vector_lane}) {{")
            self.depth += 1
            column = self.let(f"{first} + {self.vector_lane}", "col", "index")
            self.counters(self.let(f"{clamped} + {self.vector_lane}", "c", "index"), symbols)
        if walk:
            self.position = f"{walk} * {self.steps} + {step}"
            if width > 1:
                self.position = f"({self.position}) * {width} + {self.vector_lane}"
        elif kept_walk:
            self.position = (f"(threadIdx.x / LANES) * {self.kept_columns} + {column} - "
                             f"{start}")
            self.vector_position = (f"(threadIdx.x / LANES) * {self.kept_columns} + {first} - "
                                    f"{start}")
        body()
        if width > 1:
            self.depth -= 1
            self.line("}")
            self.lines[before_at:before_at] = ["    " * self.depth + b for b in self.before]
            for text in self.after_vector:
                self.line(text)
            self.before, self.vector_bound = None, {}
        self.position = None
        self.kept_before |= set(self.kept)
        for text in self.after:
            self.line(text)
        self.depth -= 1
        self.line("}")
        self.line("}")
        self.lines[insert_at:insert_at] = ["    " * self.depth + c for c in self.carries]
        self.memo = saved_memo

    def accumulators(self, reduction: Reduction) -> dict[str, str]:
        slot = {}
        for each in slots(reduction):
            target = self.name("acc")
            kind = neutral_kind(reduction, each)
            start = "0" if kind is None else NEUTRAL[kind]
            self.line(f"{c_type(each)} {target} = {start};")
            slot[each.name] = target
        return slot

    def level(self, reductions: list[Reduction]) -> None:
        spaces: dict[tuple[str, ...], list[Reduction]] = {}
        for reduction in reductions:
            spaces.setdefault(reduction.loop, []).append(reduction)
        for group in spaces.values():
            self.group(group)

    def group(self, reductions: list[Reduction]) -> None:
        """Reductions walking one loop, their accumulators filled in one pass. A mean beside a
        variance of the same values, where the kernel folds the rows itself, is the variance's
        shift plus its shifted sum over the count: no accumulator, fold or exchange of its own."""
        means = {} if self.workspaces else variance_means(reductions)
        group = [r for r in reductions if r.index not in means]
        shifts: dict[int, str] = {}
        for reduction in group:
            if reduction.node.kind == "var":
                zero = {s: Expr() for s in reduction.loop}
                first = tuple(substitute(c, zero) for c in reduction.source_coords())
                shifts[reduction.index] = self.value(reduction.node.source, first)
        slots = {r.index: self.accumulators(r) for r in group}
        # An online max-and-sum chains each value's exponential to the last one's max: in a walk
        # of vectors, each of a lane's columns keeps a pair of its own, merged after the walk.
        width = self.walk_width(list(group[0].walked))
        apart = {r.index: {name: f"{total}_apart" for name, total in slots[r.index].items()}
                 for r in group if r.online_of is not None and width > 1}
        for index, arrays in apart.items():
            for array in arrays.values():
                self.line(f"float {array}[{width}];")
            self.line(f"for (int v = 0; v < {width}; ++v) {{ {arrays['peak']}[v] = "
                      f"{slots[index]['peak']}; {arrays['total']}[v] = {slots[index]['total']}; }}")

        def body() -> None:
            for reduction in group:
                slot = slots[reduction.index]
                if reduction.index in apart:
                    slot = {name: f"{array}[{self.vector_lane}]"
                            for name, array in apart[reduction.index].items()}
                self.accumulate(reduction, slot, shifts.get(reduction.index))

        self.columns(group[0].size, list(group[0].walked), body)
        for reduction in group:
            if reduction.index in apart:
                arrays = apart[reduction.index]
                self.line(f"for (int v = 0; v < {width}; ++v) {{")
                self.fold_in(reduction, slots[reduction.index],
                             lambda name, arrays=arrays: f"{arrays[name]}[v]")
                self.line("}")
        self.fold_group(group, slots)
        if self.cluster:
            self.exchange(group, slots)
        elif self.grid:
            for reduction in group:
                self.store_partials(reduction, slots[reduction.index])
            self.barriers += 1
            self.line(f"row_barrier(&arrivals[row], {self.barriers * self.splits});")
            slots = {r.index: self.folded_partials(r) for r in group}
        for reduction in group:
            if self.workspaces and not self.grid:
                self.store_partials(reduction, slots[reduction.index])
            else:
                self.finish(reduction, slots[reduction.index])
        for mean in (r for r in reductions if r.index in means):
            var = means[mean.index]
            self.reduced[(id(mean.node), mean.coords)] = self.let(
                f"{shifts[var.index]} + {slots[var.index]['shifted']} / {float(var.size)!r}f", "r")

    def accumulate(self, reduction: Reduction, slot: dict[str, str], shift: str | None) -> None:
        kind = reduction.node.kind
        # An online sum reads its max's source: the max's result is not known yet.
        source = (reduction.online_of or reduction).node.source
        value = self.value(source, tuple(reduction.source_coords()))
        self.line(f"if ({self.masks['both']}) {{" if self.masks["both"] != "true" else "{")
        if reduction.online_of is not None:
            self.line(f"    online_add({slot['peak']}, {slot['total']}, {value});")
        elif kind in ("argmax", "argmin"):
            self.line(f"    arg_pick({slot['best']}, {slot['at']}, {value}, "
                      f"{self.bound[reduction.loop[0]]}, {str(kind == 'argmax').lower()});")
        elif kind == "var":
            self.line(f"    {slot['shifted']} += {value} - {shift};")
            self.line(f"    {slot['squares']} += ({value} - {shift}) * ({value} - {shift});")
        else:
            total = slot["total"]
            if slots(reduction)[0].dtype == torch.int64:  # a count of booleans, say
                value = f"(long long)({value})"
            self.line(f"    {total} = {FUNCTOR[kind]}()({total}, {value});")
        self.line("}")

    def finish(self, reduction: Reduction, slot: dict[str, str]) -> None:
        node, n = reduction.node, reduction.size
        if reduction.online_of is not None:
            result = self.let(f"online_total({slot['peak']}, {slot['total']})", "r")
        elif node.kind in ("argmax", "argmin"):
            result = slot["at"]
        elif node.kind == "var":
            s, q = slot["shifted"], slot["squares"]
            result = self.let(f"({q} - {s} * {s} / {float(n)!r}f) / "
                              f"{float(max(n - node.correction, 0.0))!r}f", "r")
        elif node.kind == "mean":
            result = self.let(f"{slot['total']} / {float(n)!r}f", "r")
        else:
            result = slot["total"]
        self.reduced[(id(node), reduction.coords)] = result

    # The launch.
    def body(self) -> list[str]:
        kernel = self.kernel
        self.line(f"constexpr int LANES = {self.lanes};")
        if self.rows_apart:
            # Two slots a thread: an arg fold keeps a value and an index.
            self.line(f"constexpr int ROWS = {self.rows_per_block};")
            self.line(f"__shared__ long long fold_space[{2 * self.threads}];")
            self.line("const int lane = threadIdx.x / ROWS;")
        else:
            self.line("__shared__ long long fold_space[64];")
            self.line("const int lane = threadIdx.x % LANES;")
        if self.keep and not self.registers:
            self.line("extern __shared__ __align__(16) float kept[];")
        declare_at = open_at = len(self.lines)
        if self.cluster:
            self.line(f"constexpr int CLUSTER = {self.cluster};")
            open_at = len(self.lines)
        block = "(long long)blockIdx.x"
        strided = self.schedule.resident_per_sm > 0
        if strided:
            blocks = -(-kernel.row_count // self.rows_per_block)
            block = "block"
            self.line(f"for (long long block = blockIdx.x; block < {blocks}; "
                      "block += gridDim.x) {")
            self.depth += 1
            self.line("__syncthreads();  // the last block's folds are done with fold_space")
        if self.rows_apart:
            self.line(f"const long long raw_row = {block} * ROWS + threadIdx.x % ROWS;")
        else:
            self.line(f"const long long raw_row = {block} * {self.rows_per_block} "
                      "+ threadIdx.x / LANES;")
        self.line(f"const bool row_ok = raw_row < {kernel.row_count};")
        self.line(f"const {self.index} row = row_ok ? raw_row : {kernel.row_count - 1};")
        self.counters("row", [kernel.symbols[d] for d in kernel.rows])
        split = split_launches(kernel, self.schedule)
        final = not split or self.phase == self.levels
        for level in range(self.levels if final else self.phase + 1):
            reductions = [r for r in kernel.reductions if r.level == level]
            if split and (level < self.phase or final):
                for reduction in reductions:
                    self.finish(reduction, self.folded_partials(reduction))
            else:
                self.level(reductions)
        if final:
            self.outputs()
        if strided:
            self.depth -= 1
            self.line("}")
        indent = self.lines[declare_at - 1][:-len(self.lines[declare_at - 1].lstrip())]
        if self.exchanges:
            # Each exchange's barrier, set up before any block of the cluster may send.
            self.lines[open_at:open_at] = [
                f"{indent}__shared__ unsigned long long arrivals[{self.exchanges}];",
                f"{indent}exchanges_open(arrivals);"]
        if self.fold_slots > 64:
            self.lines = [line.replace("fold_space[64];", f"fold_space[{self.fold_slots}];")
                          for line in self.lines]
        self.lines[declare_at:declare_at] = [
            f"{indent}float kept{slot}[{self.passes * self.steps * self.kept_width}];"
            for slot in (self.kept.values() if self.registers else ())]
        return without_unused(self.lines)

    def outputs(self) -> None:
        kernel = self.kernel
        if kernel.full:
            def stores() -> None:
                for i in kernel.full:
                    self.store(i, " && ".join(m for m in ("row_ok", self.masks["both"])
                                              if m != "true"), kernel.output_offset(i))
            self.columns(kernel.column_count, [kernel.symbols[d] for d in kernel.columns],
                         stores)
        for i in kernel.per_row:
            guard = "row_ok && lane == 0" + (" && blockIdx.y == 0" if self.splits > 1 else "")
            self.store(i, guard, "row")
