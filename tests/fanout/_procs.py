"""Processes as /proc shows them, for the tests that check what is left running."""

from __future__ import annotations

import time
from pathlib import Path


def _stat_fields(pid: int) -> list[str] | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rpartition(")")[2].split()  # after the command name, which may hold spaces


def running(pid: int) -> bool:
    """Whether ``pid`` is a process that still runs (a zombie has ended: only its parent's wait
    is missing)."""
    fields = _stat_fields(pid)
    return fields is not None and fields[0] not in ("Z", "X")


def children(pid: int) -> list[int]:
    """The processes whose parent is ``pid``."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            fields = _stat_fields(int(entry.name))
            if fields is not None and int(fields[1]) == pid:
                found.append(int(entry.name))
    return found


def cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def spawn_workers(parent: int) -> list[int]:
    """The children of ``parent`` that multiprocessing's spawn started (its pool's workers)."""
    return [pid for pid in children(parent) if b"spawn_main" in cmdline(pid)]


def still_running_after(pids: list[int], timeout_s: float) -> list[int]:
    """Those of ``pids`` still running once ``timeout_s`` has passed; [] as soon as all ended."""
    deadline = time.monotonic() + timeout_s
    while alive := [pid for pid in pids if running(pid)]:
        if time.monotonic() >= deadline:
            return alive
        time.sleep(0.05)  # polling another process's end, bounded
    return []
