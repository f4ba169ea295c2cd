"""Errors a user can fix: they carry what went wrong and how to fix it.

Every command-line entry point turns a `KilnInputError` into one message on stderr and exit
code 2, with no traceback. Anything else is a bug in Kiln and keeps its traceback.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import NoReturn

EXIT_BAD_INPUT = 2


class KilnInputError(Exception):
    """Bad input from the user: a spec, a file, a flag or a model that Kiln cannot use."""

    def __init__(self, problem: str, fix: str) -> None:
        super().__init__(f"{problem}\n  fix: {fix}")
        self.problem = problem
        self.fix = fix


def exit_on_input_error(main: Callable[[], int]) -> NoReturn:
    """Run a CLI `main`; a `KilnInputError` becomes one message and exit code 2."""
    try:
        code = main()
    except KilnInputError as err:
        print(f"kiln: error: {err}", file=sys.stderr)
        sys.exit(EXIT_BAD_INPUT)
    sys.exit(code)


def error_line(err: BaseException) -> str:
    """`err` in one line for a report: its type and the first line of its message."""
    return f"{type(err).__name__}: {err}".splitlines()[0][:200]


# How an allocator's failure reads, in PyTorch's CUDA and CPU allocators and the C library.
OOM_MARKERS = ("out of memory", "can't allocate memory", "OutOfMemory", "MemoryError",
               "Cannot allocate memory")


def out_of_memory(err: BaseException) -> bool:
    """Whether `err` is an allocation that failed, on the device or the host."""
    names = {cls.__name__ for cls in type(err).__mro__}  # torch.OutOfMemoryError, torch unimported
    return bool(names & {"OutOfMemoryError", "MemoryError"}) or any(
        marker in str(err) for marker in OOM_MARKERS)
