"""How a compiled CUDA kernel's reductions fold: each lane's accumulators over the lanes of its
row (warp shuffles, then shared memory), several of one kind at once, and the partial results of
other blocks (a cluster's, the GPU's, an earlier launch's) into a block's own."""

from __future__ import annotations

from collections.abc import Callable

import torch

from generators.compiler.launches import Slot, slots
from generators.compiler.plan import Reduction
from generators.cuda.walk_values import WalkValues

FUNCTOR = {"sum": "Add", "mean": "Add", "var": "Add", "prod": "Times", "amax": "NanMax",
           "amin": "NanMin"}


def c_type(slot: Slot) -> str:
    return "long long" if slot.dtype == torch.int64 else "float"


class RowFolds(WalkValues):
    """The folds of a kernel writer whose rows' lanes are consecutive threads, or, with
    `rows_apart`, a block's rows apart; `fold_slots`: the `fold_space` the folds take. A row
    shared by a `cluster` of blocks exchanges its totals (`exchanges` so far); one split over
    `splits` blocks stores them in workspaces (the writer's `workspace` and `accumulators`)."""

    rows_apart: bool
    fold_slots: int
    lanes: int
    cluster: int
    splits: int
    exchanges: int
    accumulators: Callable[[Reduction], dict[str, str]]
    workspace: Callable[[Reduction, str], str]

    def fold_group(self, group: list[Reduction], totals: dict[int, dict[str, str]]) -> None:
        """The group's accumulators folded into the rows' totals: those of one type and fold
        together, through one trip of shared memory (`fold_row_all`)."""
        batches: dict[tuple[str, str], list[str]] = {}
        for reduction in group:
            if (reduction.node.kind in ("argmax", "argmin") or self.rows_apart
                    or reduction.online_of is not None):
                self.fold(reduction, totals[reduction.index])
                continue
            for each in slots(reduction):
                batch = (FUNCTOR[reduction.node.kind], c_type(each))
                batches.setdefault(batch, []).append(totals[reduction.index][each.name])
        for (functor, element), values in batches.items():
            if len(values) == 1:
                self.line(f"{values[0]} = fold_row<LANES>({values[0]}, {functor}(), "
                          "fold_space);")
                continue
            together = self.name("fold")
            self.fold_slots = max(self.fold_slots, 32 * len(values))
            self.line(f"{element} {together}[{len(values)}] = {{{', '.join(values)}}};")
            self.line(f"fold_row_all<LANES>({together}, {functor}(), fold_space);")
            for k, value in enumerate(values):
                self.line(f"{value} = {together}[{k}];")

    def fold(self, reduction: Reduction, slot: dict[str, str]) -> None:
        """The lanes' accumulators folded into the row's totals, held by every lane."""
        kind = reduction.node.kind
        apart = "_rows_apart<LANES, ROWS>" if self.rows_apart else "_row<LANES>"
        if reduction.online_of is not None:  # never rows apart: the plan fuses none there
            self.line(f"fold_row_pair<LANES>({slot['peak']}, {slot['total']}, OnlinePick(), "
                      "fold_space);")
            return
        if kind in ("argmax", "argmin"):
            self.line(f"arg_fold{apart}({slot['best']}, {slot['at']}, "
                      f"{str(kind == 'argmax').lower()}, fold_space);")
            return
        for total in slot.values():
            self.line(f"{total} = fold{apart}({total}, {FUNCTOR[kind]}(), fold_space);")

    def fold_in(self, reduction: Reduction, slot: dict[str, str],
                partial: Callable[[str], str]) -> None:
        """A loop body's lines folding into the accumulators `slot` the partial results
        `partial(name)` reads, as the accumulators were folded."""
        kind = reduction.node.kind
        if reduction.online_of is not None:
            self.line(f"    online_pick({slot['peak']}, {slot['total']}, {partial('peak')}, "
                      f"{partial('total')});")
            return
        if kind in ("argmax", "argmin"):
            self.line(f"    arg_pick({slot['best']}, {slot['at']}, {partial('best')}, "
                      f"{partial('at')}, {str(kind == 'argmax').lower()});")
            return
        for name, total in slot.items():
            self.line(f"    {total} = {FUNCTOR[kind]}()({total}, {partial(name)});")

    def exchange(self, group: list[Reduction], totals: dict[int, dict[str, str]]) -> None:
        """Each block's totals of its share of the rows sent to every block of the cluster
        (the exchange's own barrier counting their bytes in), then, once all have arrived,
        folded over the blocks in rank order (the same order, so the same result, in every
        block)."""
        row = "threadIdx.x % ROWS" if self.rows_apart else "threadIdx.x / LANES"
        if not self.exchanges:
            self.line("exchanges_ready();  // every block's barriers are set up")
        arrived = f"&arrivals[{self.exchanges}]"
        self.exchanges += 1
        inboxes: dict[tuple[int, str], str] = {}
        sends, incoming = [], 0
        for reduction in group:
            for each in slots(reduction):
                inbox = self.name("inbox")
                inboxes[(reduction.index, each.name)] = inbox
                self.line(f"__shared__ {c_type(each)} {inbox}[{self.rows_per_block} * CLUSTER];")
                incoming += self.rows_per_block * self.cluster * each.dtype.itemsize
                at, value = f"&{inbox}[({row}) * CLUSTER + blockIdx.y]", totals[
                    reduction.index][each.name]
                # Every lane holds the totals: a row of CLUSTER lanes or more sends to all the
                # blocks at once, rather than one lane sending to each in turn.
                sends.append(f"if (lane < CLUSTER) {{ send_to_block({at}, {value}, {arrived}, "
                             "lane); }" if self.lanes >= self.cluster else
                             f"if (lane == 0) {{ send_to_cluster<CLUSTER>({at}, {value}, "
                             f"{arrived}); }}")
        self.line(f"expect_bytes({arrived}, {incoming});")
        for text in sends:
            self.line(text)
        self.line(f"wait_for_bytes({arrived});")
        for reduction in group:
            slot = totals[reduction.index]

            def sent(name: str, rank: str, index: int = reduction.index) -> str:
                return f"{inboxes[(index, name)]}[({row}) * CLUSTER + {rank}]"

            for name, total in slot.items():
                self.line(f"{total} = {sent(name, '0')};")
            self.line("for (int rank = 1; rank < CLUSTER; ++rank) {")
            self.fold_in(reduction, slot, lambda name, sent=sent: sent(name, "rank"))
            self.line("}")

    def store_partials(self, reduction: Reduction, slot: dict[str, str]) -> None:
        for each in slots(reduction):
            self.line(f"if (lane == 0 && row_ok) {{ {self.workspace(reduction, each.name)}"
                      f"[row * {self.splits} + blockIdx.y] = {slot[each.name]}; }}")

    def folded_partials(self, reduction: Reduction) -> dict[str, str]:
        """The row's partial results of `reduction`, stored by an earlier launch or by the row's
        blocks before their barrier, folded over the splits in order (the same result in every
        block); read from L2, which every SM sees, past the SM's own cache."""
        slot = self.accumulators(reduction)
        self.line(f"for (int part = lane; part < {self.splits}; part += LANES) {{")
        self.fold_in(reduction, slot, lambda name: f"__ldcg(&{self.workspace(reduction, name)}"
                                                   f"[row * {self.splits} + part])")
        self.line("}")
        self.fold(reduction, slot)
        return slot
