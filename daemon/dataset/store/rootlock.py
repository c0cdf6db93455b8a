"""One writer per dataset root: an exclusive ``flock`` held for the writer's whole life.

Two writers on one root destroy each other's work: the second one's start-up recovery deletes
the first one's open episode, then both commit episode 0 to the same journal folder. So every
command that changes a root (the daemon, ``record --sim``, ``repair``, ``edit``, ``render``)
holds this lock, and a second one is refused with the holder's pid and command. ``check`` only
reads, and takes no lock.

``flock`` belongs to the open file, so the kernel drops it when the holder dies, SIGKILL
included: a crash never leaves a root locked. The file itself stays (it says who held it last).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import sys
import time
from pathlib import Path
from types import TracebackType

from hilrec.daemon.atomic import is_temp_name
from hilrec.daemon.dataset.format.edit_intent import EDIT_INTENT_PATH
from hilrec.daemon.errors import DatasetLockedError, DatasetStateError

LOCK_NAME = ".hilrec-writer.lock"


def lock_path(root: Path) -> Path:
    return Path(root) / LOCK_NAME


def holds_nothing(root: Path) -> bool:
    """True for a missing root, or a folder whose only content is a lock file left by a writer
    that never wrote (a refused create, a crash before the first file): nothing to resume."""
    root = Path(root)
    if not root.exists():
        return True
    return root.is_dir() and all(entry.name == LOCK_NAME for entry in root.iterdir())


def holds_only_edit_files(root: Path) -> bool:
    """A folder holding nothing but a writer's lock and an edit's record (or the record's
    half-written temporary file): what a ``hilrec edit --out`` killed before it wrote anything
    leaves."""
    root = Path(root)
    if not root.is_dir():
        return False
    record = Path(EDIT_INTENT_PATH)
    for entry in root.iterdir():
        if entry.name == LOCK_NAME:
            continue
        if entry.name != record.parts[0] or not entry.is_dir() or entry.is_symlink():
            return False
        if any(e.name != record.name and not is_temp_name(e.name) for e in entry.iterdir()):
            return False
    return True


class RootLock:
    """``with RootLock(root, "hilrec repair"):`` or ``acquire()`` ... ``release()``."""

    def __init__(self, root: Path, command: str | None = None) -> None:
        self.root = Path(root)
        self.command = command or " ".join(["hilrec", *sys.argv[1:2]]) or "hilrec"
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def acquire(self) -> RootLock:
        if self._fd is not None:
            return self
        path = lock_path(self.root)
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError as exc:
            raise DatasetStateError(
                f"cannot lock dataset root {self.root}: {exc.strerror} ({path})"
            ) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            holder = _read_holder(fd)
            os.close(fd)
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                raise DatasetLockedError(
                    f"dataset root {self.root} is being written by {holder}; "
                    "one writer at a time: stop that one first (hilrec check may read it meanwhile)"
                ) from None
            raise DatasetStateError(f"cannot lock dataset root {self.root}: {exc.strerror}") from None
        os.ftruncate(fd, 0)
        record = {"pid": os.getpid(), "command": self.command, "since_unix_s": round(time.time(), 3)}
        os.pwrite(fd, (json.dumps(record) + "\n").encode(), 0)
        self._fd = fd
        return self

    def release(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            with contextlib.suppress(OSError):
                fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)

    def __enter__(self) -> RootLock:
        return self.acquire()

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.release()


def _read_holder(fd: int) -> str:
    try:
        record = json.loads(os.pread(fd, 4096, 0).decode("utf-8"))
        return f"pid {int(record['pid'])} ({record['command']})"
    except (OSError, ValueError, KeyError, TypeError):
        return "another process (its pid could not be read from the lock file)"
