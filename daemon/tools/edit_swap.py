"""The safe swap of ``hilrec edit``: a checked result takes its target's place, never neither.

The result is written into a sibling folder ``.<name>.hilrec-edit-<pid>-<token>`` of the target
(same file system, locked). Once checked, result and target are exchanged by
``renameat2(RENAME_EXCHANGE)``: one rename that swaps two directory entries, so at every instant
the target path holds either the source or the checked result. The old source, now in the
sibling folder, is removed after.

Where the file system has no ``RENAME_EXCHANGE`` (ENOSYS/EINVAL), the swap is two renames
(target -> old folder, result -> target), with an intent file ``.<name>.hilrec-edit-<id>.json``
written (fsynced) before them. A kill between the two leaves the target missing; the next
``hilrec edit`` of that root (or :func:`recover`) reads the intent and renames the checked
result into place, then removes the old folder. Before the first rename it removes the result.
Leftover sibling folders whose owner is gone are removed by :func:`clean_leftovers`.
"""

from __future__ import annotations

import ctypes
import errno
import os
import secrets
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Final

from hilrec.daemon.atomic import fsync_dir, json_bytes, read_json, write_synced
from hilrec.daemon.dataset import RootLock
from hilrec.daemon.errors import DatasetStateError

Hook = Callable[[str], None] | None

TEMP_MARK: Final[str] = ".hilrec-edit-"
RENAME_EXCHANGE: Final[int] = 2
AT_FDCWD: Final[int] = -100
# renameat2 by syscall number where libc has no wrapper (glibc < 2.28).
_SYS_RENAMEAT2: Final[dict[str, int]] = {"x86_64": 316, "aarch64": 276, "armv7l": 382, "armv6l": 382}


def hook_point(hook: Hook, name: str) -> None:
    """Tell the test hook (kill points) that step ``name`` is done."""
    if hook is not None:
        hook(name)


def result_dir(target: Path) -> Path:
    """A new sibling folder name for an edit of ``target``."""
    return target.parent / f".{target.name}{TEMP_MARK}{os.getpid()}-{secrets.token_hex(4)}"


def temp_dirs(target: Path) -> list[Path]:
    """Sibling folders of edits of ``target`` (live, or left by a killed edit)."""
    target = Path(target)
    return sorted(
        p for p in target.parent.glob(f".{target.name}{TEMP_MARK}*") if p.is_dir() and not p.is_symlink()
    )


def _intent_files(target: Path) -> list[Path]:
    return sorted(target.parent.glob(f".{target.name}{TEMP_MARK}*.json"))


def recover(target: Path) -> list[str]:
    """Finish or undo what a killed edit of ``target`` left (see the module docstring); returns
    what it did. Call it with no edit of ``target`` running (``hilrec edit`` does, first)."""
    target = Path(target)
    done: list[str] = []
    for intent_path in _intent_files(target):
        intent = read_json(intent_path, if_missing=None) or {}
        new, old = Path(intent.get("new", "")), Path(intent.get("old", ""))
        if not os.path.lexists(target) and intent.get("new") and new.is_dir():
            os.rename(new, target)
            fsync_dir(target.parent)
            done.append(f"moved the checked result {new.name} into place at {target}")
        elif not os.path.lexists(target) and intent.get("old") and old.is_dir():
            os.rename(old, target)
            fsync_dir(target.parent)
            done.append(f"moved the source {old.name} back to {target}")
        intent_path.unlink(missing_ok=True)
    return done


def clean_leftovers(target: Path) -> list[Path]:
    """Remove the sibling folders of edits whose process is gone (their lock is free)."""
    removed = []
    for directory in temp_dirs(target):
        lock = RootLock(directory, "hilrec edit (cleaning)")
        try:
            lock.acquire()
        except DatasetStateError:
            continue  # a live edit's
        try:
            shutil.rmtree(directory)
            removed.append(directory)
        finally:
            lock.release()
    if removed:
        fsync_dir(Path(target).parent)
    return removed


def _libc_renameat2() -> Callable[..., int] | None:
    libc = ctypes.CDLL(None, use_errno=True)
    func = getattr(libc, "renameat2", None)
    if func is not None:
        func.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
        func.restype = ctypes.c_int
        return func  # type: ignore[no-any-return,unused-ignore]
    number = _SYS_RENAMEAT2.get(os.uname().machine)
    if number is None:
        return None
    syscall = libc.syscall

    def via_syscall(olddirfd: int, old: bytes, newdirfd: int, new: bytes, flags: int) -> int:
        return int(syscall(number, olddirfd, old, newdirfd, new, flags))

    return via_syscall


def exchange(a: Path, b: Path) -> bool:
    """Swap two directory entries atomically; False when the system cannot (then nothing moved)."""
    func = _libc_renameat2()
    if func is None or os.environ.get("HILREC_EDIT_NO_EXCHANGE") == "1":
        return False
    result = func(AT_FDCWD, os.fsencode(a), AT_FDCWD, os.fsencode(b), RENAME_EXCHANGE)
    if result == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.ENOSYS, errno.EINVAL, errno.ENOTSUP):
        return False
    raise OSError(err, f"renameat2({a}, {b}, RENAME_EXCHANGE): {os.strerror(err)}")


def swap_in(target: Path, result: Path, hook: Hook = None) -> tuple[str, Path]:
    """Put the checked ``result`` at ``target``; returns (how, the folder now holding the old
    target) for the caller to remove."""
    if exchange(result, target):
        fsync_dir(target.parent)
        hook_point(hook, "exchanged")
        return "exchange", result
    old = target.parent / f".{target.name}{TEMP_MARK}{os.getpid()}-{secrets.token_hex(4)}-old"
    intent = target.parent / f".{target.name}{TEMP_MARK}{os.getpid()}-{secrets.token_hex(4)}.json"
    write_synced(intent, json_bytes({"target": str(target), "new": str(result), "old": str(old)}))
    fsync_dir(target.parent)
    hook_point(hook, "intent-written")
    os.rename(target, old)
    try:
        hook_point(hook, "renamed-old")
        os.rename(result, target)
    except BaseException:
        # Not a kill (that is recover()'s): an error between the renames puts the source back.
        if not os.path.lexists(target):
            os.rename(old, target)
        intent.unlink(missing_ok=True)
        fsync_dir(target.parent)
        raise
    fsync_dir(target.parent)
    intent.unlink()
    hook_point(hook, "exchanged")
    return "two renames", old
