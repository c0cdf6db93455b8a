"""Running one ``hilrec edit``: lock, build the result beside the target, check it, swap it in.

The steps and why a kill at any of them loses nothing: :mod:`hilrec.daemon.tools.edit`.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from hilrec.daemon.atomic import fsync_dir
from hilrec.daemon.dataset import (
    INFO_PATH,
    CheckReport,
    IntentState,
    RootLock,
    check_dataset,
    holds_only_edit_files,
    remove_edit_intent,
    write_edit_intent,
)
from hilrec.daemon.errors import DatasetError
from hilrec.daemon.tools.edit_resume import Intent, prior_part
from hilrec.daemon.tools.edit_source import EditReport, Source
from hilrec.daemon.tools.edit_swap import (
    Hook,
    clean_leftovers,
    hook_point,
    recover,
    result_dir,
    swap_in,
)


@dataclass
class Options:
    """How an edit checks its result: ``decode`` the videos (the full check), on ``workers``."""

    decode: bool = True
    workers: int | None = 1
    hook: Hook = None


def run_edit(
    command: str,
    roots: Sequence[Path],
    target: Path,
    build: Callable[[Sequence[Source], Path, EditReport], None],
    options: Options | None = None,
    *,
    flags: Sequence[str] = (),
    outs: Sequence[Path] | None = None,
) -> EditReport:
    """Lock ``roots`` and ``target``, build the result beside ``target``, check it, swap it in.

    ``flags`` are the command's arguments as a person types them, and ``outs`` every output of
    the command (``target`` among them): with ``--out`` they are recorded in the target
    (:mod:`hilrec.daemon.tools.edit_resume`) so that the same command run again finishes the work.
    """
    options = options or Options()
    hook = options.hook
    started = time.monotonic()
    roots = [Path(r) for r in roots]
    target = Path(target)
    in_place = target in roots
    label = f"hilrec edit {command}"
    for root in roots:
        recover(root)
    intent: Intent | None = None
    if not in_place:
        recover(target)
        intent = Intent.of(command, roots, [Path(o) for o in outs or [target]], target, flags)
        if prior_part(intent, target):
            report = EditReport(command=command, target=target, swap="already written by an earlier run")
            report.notes.append(f"{target} was written by an earlier run of `{intent.command_line}`; kept")
            return report
    created_out = not in_place and (not os.path.lexists(target) or holds_only_edit_files(target))
    locks: list[RootLock] = []
    result: Path | None = None
    done = False
    try:
        for root in dict.fromkeys([*roots, target]):
            if root in roots and not (root / INFO_PATH).exists():
                raise DatasetError(f"{root}: no meta/info.json: not a LeRobot dataset root")
            locks.append(RootLock(root, label).acquire())
        if intent is not None:
            write_edit_intent(target, intent.record(IntentState.BUILDING))
            hook_point(hook, "out-intent-written")
        hook_point(hook, "locked")
        for root in dict.fromkeys([*roots, target]):
            clean_leftovers(root)
        sources = [Source.load(r) for r in roots]
        result = result_dir(target)
        result.mkdir()
        locks.append(RootLock(result, label).acquire())
        hook_point(hook, "temp-created")
        report = EditReport(command=command, target=target)
        with _disk_full_named(command, target):
            build(sources, result, report)
            checked = check_dataset(result, decode_video=options.decode, workers=options.workers)
            _refuse_findings(checked, command)
            hook_point(hook, "checked")
            if intent is not None and intent.parts > 1:
                # A part of several: it says so until the last one is written (edit_resume).
                write_edit_intent(result, intent.record(IntentState.DONE))
            how, old = swap_in(target, result, hook)
        result = old  # what is left to remove: the old target
        report.swap = how if in_place else f"written to --out ({how})"
        shutil.rmtree(old)
        result = None
        fsync_dir(target.parent)
        hook_point(hook, "cleaned")
        report.seconds = time.monotonic() - started
        done = True
        return report
    finally:
        if result is not None:
            with contextlib.suppress(OSError):
                shutil.rmtree(result)
        # The --out folder this edit made for its lock and record, holding nothing else, goes too.
        # Only with its lock held: a folder another live edit is building is that edit's.
        target_held = any(lock.root == target and lock.held for lock in locks)
        if created_out and not done and target_held and holds_only_edit_files(target):
            shutil.rmtree(target, ignore_errors=True)
        for lock in reversed(locks):
            lock.release()


def finish_parts(outs: Sequence[Path], hook: Hook = None) -> None:
    """Every part of an edit of several outputs is written: they stop saying they are parts."""
    for out in outs:
        remove_edit_intent(out)
        hook_point(hook, "record-removed")


@contextlib.contextmanager
def _disk_full_named(command: str, target: Path) -> Iterator[None]:
    """A full disk while the result is written is the user's to fix, not a traceback: it is
    named, with the free space, and the source is as it was (the result is removed)."""
    try:
        yield
    except OSError as exc:
        text = str(exc)
        if exc.errno not in (errno.ENOSPC, errno.EDQUOT) and "No space left" not in text:
            raise
        try:
            free = shutil.disk_usage(target.parent).free
        except OSError:
            free = -1
        raise DatasetError(
            f"hilrec edit {command}: the disk holding {target.parent} is full "
            f"({free / 1e6:.1f} MB free) while writing the result ({_first_line(text)}); "
            "the source is unchanged and the partial result is removed: free space and run it again"
        ) from None


def _first_line(text: str, limit: int = 160) -> str:
    line = text.strip().splitlines()[0] if text.strip() else "no space left on device"
    return line if len(line) <= limit else line[: limit - 3] + "..."


def _refuse_findings(checked: CheckReport, command: str) -> None:
    if not checked.failures:
        return
    shown = "; ".join(f"{f.severity.upper()} {f.format()}" for f in checked.failures[:5])
    more = f" (and {len(checked.failures) - 5} more)" if len(checked.failures) > 5 else ""
    raise DatasetError(
        f"hilrec edit {command}: the result fails hilrec check ({len(checked.errors)} error(s), "
        f"{len(checked.warnings)} warning(s)): {shown}{more}; the source is unchanged"
    )


def hook_of(options: Options | None) -> Hook:
    return options.hook if options is not None else None
