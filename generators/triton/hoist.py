"""Loop-invariant statements of a Triton kernel's loop moved before it.

A program that strides over blocks of rows (`Schedule.resident_per_sm`) walks the same columns
on every pass: the columns, their masks and what is loaded along them alone (a norm's weight and
bias) are the same each time. Triton's own passes on sm_90 leave such loads in the loop, where
the software pipeliner copies them again on every pass (read from the compiled TTGIR of a
layer_norm's kernel); moved before the loop, they are read once a program and kept in registers.
"""

from __future__ import annotations

import re
from collections import Counter

_ASSIGNMENT = re.compile(r"^(\s*)(\w+) = (.*)$")
_LOOP = re.compile(r"^(\s*)for (\w+) in ")
_NAME = re.compile(r"\b[A-Za-z_]\w*\b")
# What may not move: reads of memory the kernel writes (its outputs, its workspaces) and
# operations with effects.
_PINNED = re.compile(r"\b(out\d+|ws\d+)\b|tl\.(atomic_\w+|store|debug_barrier)\b")


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip())


def invariants_hoisted(lines: list[str], loop: int) -> list[str]:
    """`lines` with the assignments directly in the body of the loop at `lines[loop]` that read
    nothing the loop changes moved before it, in their order. A name bound more than once
    anywhere in the kernel stays where it is (an accumulator), as does a statement that reads
    what the kernel writes."""
    head = _LOOP.match(lines[loop])
    if head is None:
        raise ValueError(f"line {loop} starts no loop: {lines[loop]!r}")
    depth = len(head.group(1))
    end = loop + 1
    while end < len(lines) and (not lines[end].strip() or _indent(lines[end]) > depth):
        end += 1
    body = lines[loop + 1:end]
    bound = Counter(found.group(2) for line in lines if (found := _ASSIGNMENT.match(line)))
    changing = {head.group(2)} | {found.group(2) for line in body
                                  if (found := _ASSIGNMENT.match(line) or _LOOP.match(line))}
    moved: list[str] = []
    kept: list[str] = []
    invariant: set[str] = set()
    for line in body:
        found = _ASSIGNMENT.match(line)
        if (found and _indent(line) == depth + 4 and bound[found.group(2)] == 1
                and not _PINNED.search(found.group(3))
                and all(name in invariant or name not in changing
                        for name in _NAME.findall(found.group(3)))):
            invariant.add(found.group(2))
            moved.append(" " * depth + line.lstrip())
        else:
            kept.append(line)
    return lines[:loop] + moved + [lines[loop]] + kept + lines[end:]
