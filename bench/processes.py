"""The machine's processes as /proc shows them, for benchmarks that follow a run's process
tree (its workers, their zygotes and candidates' processes)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class ProcessStat:
    parent: int
    cpu_ticks: int  # user and system time, its own and its reaped children's


def process_table() -> dict[int, ProcessStat]:
    """Every process alive now, by PID (one that ends while it is read is left out)."""
    table: dict[int, ProcessStat] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        table[int(stat.parent.name)] = ProcessStat(int(fields[1]),
                                                   sum(int(f) for f in fields[11:15]))
    return table


def descendants(root: int, table: dict[int, ProcessStat]) -> list[int]:
    """`root` and every process below it in `table`, parents before their children."""
    found, todo = [], [root]
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo += [child for child, stat in table.items() if stat.parent == pid]
    return found
