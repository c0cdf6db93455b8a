"""The child processes of a process, read from /proc: what a test or benchmark looks for when it
checks what a daemon (or collect) has started, or lifts or kills one of them."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Child:
    pid: int
    argv: list[bytes]


def children(parent: int, module: str | None = None) -> list[Child]:
    """``parent``'s children; with ``module``, only those it runs (``python -m module …``)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue  # gone while we looked
        ppid = int(stat.rsplit(")", 1)[1].split()[1])  # the name in brackets may hold spaces
        if ppid == parent and (module is None or module.encode() in argv):
            found.append(Child(int(entry.name), argv))
    return found
