"""Running one ``hilrec edit``: lock, build the result beside the target, check it, swap it in.

The steps and why a kill at any of them loses nothing: :mod:`hilrec.daemon.tools.edit`.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from hilrec.daemon.atomic import fsync_dir
from hilrec.daemon.dataset import INFO_PATH, LOCK_NAME, CheckReport, RootLock, check_dataset
from hilrec.daemon.errors import DatasetError, DatasetStateError
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
) -> EditReport:
    """Lock ``roots`` and ``target``, build the result beside ``target``, check it, swap it in."""
    options = options or Options()
    hook = options.hook
    started = time.monotonic()
    roots = [Path(r) for r in roots]
    target = Path(target)
    in_place = target in roots
    label = f"hilrec edit {command}"
    for root in roots:
        recover(root)
    if not in_place:
        recover(target)
        if os.path.lexists(target) and any(c.name != LOCK_NAME for c in target.iterdir()):
            raise DatasetStateError(f"--out {target} exists and is not empty; give a new folder")
    created_out = not in_place and not os.path.lexists(target)
    locks: list[RootLock] = []
    result: Path | None = None
    done = False
    try:
        for root in dict.fromkeys([*roots, target]):
            if root in roots and not (root / INFO_PATH).exists():
                raise DatasetError(f"{root}: no meta/info.json: not a LeRobot dataset root")
            locks.append(RootLock(root, label).acquire())
        hook_point(hook, "locked")
        for root in dict.fromkeys([*roots, target]):
            clean_leftovers(root)
        sources = [Source.load(r) for r in roots]
        result = result_dir(target)
        result.mkdir()
        locks.append(RootLock(result, label).acquire())
        hook_point(hook, "temp-created")
        report = EditReport(command=command, target=target)
        build(sources, result, report)
        checked = check_dataset(result, decode_video=options.decode, workers=options.workers)
        _refuse_findings(checked, command)
        hook_point(hook, "checked")
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
        # The --out folder this edit made for its lock, holding nothing else, goes too.
        if (
            created_out
            and not done
            and target.is_dir()
            and all(c.name == LOCK_NAME for c in target.iterdir())
        ):
            shutil.rmtree(target, ignore_errors=True)
        for lock in reversed(locks):
            lock.release()


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
