"""Ctrl-C while the workers judge: the run stops once the kernels in their hands are stored.

A KeyboardInterrupt in the middle of a batch would leave the pool's threads waiting on their
workers anyway, and lose verdicts that were moments away. Inside `deferred()` the first Ctrl-C
only asks the run to stop, which it does at its next step; elsewhere (profiling, the end-to-end
check, all in this process) Ctrl-C stops at once. Either way the run is left to the store as
interrupted, resumable.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType

from core.profile.progress import Progress

EXIT_INTERRUPTED = 130  # 128 + SIGINT, as a shell reports a command Ctrl-C stopped


class GracefulStop:
    def __init__(self, progress: Progress) -> None:
        self.progress = progress
        self.requested = False

    @contextmanager
    def deferred(self) -> Iterator[None]:
        """Ctrl-C inside the block asks for a stop rather than raising (main thread only: no
        other thread can take signals)."""
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        previous = signal.signal(signal.SIGINT, self._ask)
        try:
            yield
        finally:
            signal.signal(signal.SIGINT, previous)

    def _ask(self, signum: int, frame: FrameType | None) -> None:
        if self.requested:
            self.progress.step("still finishing the kernels being judged; kill -9 stops at "
                               "once, losing them (the run stays resumable)")
            return
        self.requested = True
        self.progress.step("interrupted: stopping once the kernels being judged are stored")

    def check(self) -> None:
        """Between steps: stop here if a stop was asked for."""
        if self.requested:
            raise KeyboardInterrupt
