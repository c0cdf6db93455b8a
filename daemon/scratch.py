"""A temporary folder a SIGKILL does not leave behind for good.

``tempfile.TemporaryDirectory`` removes its folder when the ``with`` ends, and a SIGKILLed
process ends nothing: every emulated daemon the kill tests stopped that way left its
``hilrec-emulated-*`` folder (two calibration files) in ``/tmp``, hundreds of them on a test
machine in a day. So a :func:`scratch_folder` is held, for its owner's whole life, by an
exclusive ``flock`` on the folder itself (the kernel drops it when the owner dies, however it
dies), and each new one first removes the folders of its kind that nobody holds.

The window between creating a folder and locking it is closed on the owner's side: a sweeper
that removed the folder in between makes the owner's check (is the locked folder still the one at
that path?) fail, and the owner makes another.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import shutil
import stat
import tempfile
from pathlib import Path

log = logging.getLogger(__name__)

_OPEN_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def scratch_folder(stack: contextlib.ExitStack, prefix: str) -> Path:
    """A new folder ``<tempdir>/<prefix>XXXXXXXX``, locked until ``stack`` closes, then removed.
    Folders of the same prefix that no live process holds are removed first."""
    swept = sweep(prefix)
    if swept:
        log.info("removed %d unheld %s* folder(s) a killed process left: %s", len(swept), prefix, swept)
    while True:
        path = Path(tempfile.mkdtemp(prefix=prefix))
        try:
            fd = os.open(path, _OPEN_FLAGS)
        except FileNotFoundError:
            continue  # a sweeper removed it before it was opened
        try:
            held = _lock(fd, path)
        except BaseException:
            os.close(fd)
            shutil.rmtree(path, ignore_errors=True)
            raise
        if held:
            break
        os.close(fd)  # swept, or held by a sweeper's child: another name
    # LIFO: the folder goes, then its lock.
    stack.callback(os.close, fd)
    stack.callback(shutil.rmtree, path, ignore_errors=True)
    return path


def _lock(fd: int, path: Path) -> bool:
    """Lock the folder open on ``fd``; False if it is not ours to keep (a sweeper removed it, or
    holds it: a sweeper that forked meanwhile leaves its child holding the lock). Where the file
    system has no ``flock`` (NFS with some clients), the folder is kept unlocked: a sweep there
    cannot lock it either, so it is never taken for a dead owner's."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    except OSError as exc:
        log.warning("%s cannot be locked (%s); kept unlocked", path, exc.strerror)
        return True
    try:
        return os.path.samestat(os.fstat(fd), os.stat(path, follow_symlinks=False))
    except FileNotFoundError:
        return False


def sweep(prefix: str) -> list[str]:
    """Remove this user's ``<tempdir>/<prefix>*`` folders that no process holds locked; the
    names removed. A held folder, a symlink or another user's folder is left alone."""
    removed = []
    for path in sorted(Path(tempfile.gettempdir()).glob(f"{prefix}*")):
        try:
            fd = os.open(path, _OPEN_FLAGS)
        except OSError:
            continue
        try:
            info = os.fstat(fd)
            if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.geteuid():
                continue
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                continue  # held: its owner is alive (or no flock here: nothing is known)
            try:
                if not os.path.samestat(info, os.lstat(path)):
                    continue  # the name is another folder's now
            except OSError:
                continue
            shutil.rmtree(path, ignore_errors=True)
            if not path.exists():
                removed.append(path.name)
        finally:
            os.close(fd)
    return removed
