"""Progress on stderr for the slow steps, so stdout stays clean for tables and JSON."""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field


@dataclass
class Progress:
    enabled: bool = True
    started: float = field(default_factory=time.perf_counter)

    def step(self, message: str) -> None:
        if self.enabled:
            print(f"[kiln {time.perf_counter() - self.started:6.1f}s] {message}", file=sys.stderr,
                  flush=True)

    def bar(self, label: str):
        """A callback `(done, total)` drawing a bar; redrawn in place on a terminal."""
        tty = sys.stderr.isatty()

        def update(done: int, total: int) -> None:
            if not self.enabled or (not tty and done != total):
                return
            filled = 30 * done // max(total, 1)
            line = f"  {label} [{'#' * filled}{'.' * (30 - filled)}] {done}/{total}"
            print("\r" + line if tty else line, end="\n" if done == total else "",
                  file=sys.stderr, flush=True)

        return update
