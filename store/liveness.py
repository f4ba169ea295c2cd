"""Whether the process writing a run is still alive.

Each run records its writer: host name, pid and a token made of the boot id and the process's
start time. On the writer's own host that decides it exactly, even after a `kill -9` (nothing
runs on exit) and even when the pid has since been reused. A run written from another host
(a store on a shared disk) can only be judged by its heartbeat, which every write refreshes.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

# One candidate's evaluation (compile, correctness trials, timing) can take minutes between two
# writes, so a writer on another host is presumed dead only after a quarter of an hour of silence.
HEARTBEAT_STALE = timedelta(minutes=15)


@dataclass(frozen=True)
class Writer:
    host: str
    pid: int
    token: str | None


def _boot_id() -> str | None:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return None


def process_token(pid: int) -> str | None:
    """Boot id and start time of a live process, None if it is gone or this is not Linux."""
    boot = _boot_id()
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name (field 2) may hold spaces and parentheses: split after its last ')'.
    fields = stat[stat.rindex(")") + 2 :].split()
    state, start_ticks = fields[0], fields[19]
    if boot is None or state in ("Z", "X"):
        return None
    return f"{boot}:{start_ticks}"


def this_writer() -> Writer:
    return Writer(host=socket.gethostname(), pid=os.getpid(), token=process_token(os.getpid()))


def _pid_exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def writer_alive(writer: Writer, heartbeat_at: datetime, now: datetime) -> bool:
    if writer.host != socket.gethostname():
        return now - heartbeat_at < HEARTBEAT_STALE
    if writer.token is not None:
        return process_token(writer.pid) == writer.token
    return _pid_exists(writer.pid)


def run_writer_alive(run: Mapping[str, Any], now: datetime) -> bool:
    """`writer_alive` for a row of the `runs` table."""
    writer = Writer(run["writer_host"], run["writer_pid"], run["writer_token"])
    return writer_alive(writer, datetime.fromisoformat(run["heartbeat_at"]), now)
