"""What is damage and what is not, and the disk space repair needs before it writes.

A full disk (or an exhausted quota) and a refused access are not damage: the files may be fine,
so repair drops no copy of anything for them. Before each step that writes, repair estimates
what it needs and refuses (as the disk would, with ENOSPC) when that is not free; when the disk
fills anyway, it puts back what it had started and the report says how many bytes to free.
"""

from __future__ import annotations

import errno
import os
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Final

import av
import pyarrow as pa

from hilrec.daemon.dataset.format.features import video_keys
from hilrec.daemon.dataset.format.paths import data_path, data_ref, video_path, video_ref
from hilrec.daemon.dataset.format.sidecar import sidecar_dir
from hilrec.daemon.dataset.repair.report import RepairReport
from hilrec.daemon.dataset.store import journal
from hilrec.daemon.dataset.store.consolidate import ConsolidatedState
from hilrec.daemon.errors import HilrecError

# Beyond the files' own bytes: directories, metadata files, the parquet and mp4 containers.
SPACE_SLACK_BYTES: Final[int] = 256 * 1024
SPACE_PER_EPISODE_BYTES: Final[int] = 16 * 1024
# What a damaged file can make reading raise (beyond hilrec's own CorruptDatasetError).
DAMAGE: Final[tuple[type[BaseException], ...]] = (
    HilrecError,
    OSError,
    KeyError,
    TypeError,
    ValueError,
    IndexError,
    AttributeError,
    pa.ArrowException,
    av.FFmpegError,
)


def not_damage(exc: BaseException) -> bool:
    """A full disk or a refused access: the files may be fine, so no copy of them is dropped."""
    return out_of_space(exc) or inaccessible(exc)


def inaccessible(exc: BaseException | None) -> bool:
    seen = 0
    while exc is not None and seen < 10:
        if isinstance(exc, OSError) and exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
            return True
        exc = exc.__cause__ or exc.__context__
        seen += 1
    return False


def out_of_space(exc: BaseException | None) -> bool:
    """Whether ``exc`` (or what caused it) is a full disk or an exhausted quota."""
    seen = 0
    while exc is not None and seen < 10:
        if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        if "No space left on device" in str(exc):
            return True
        exc = exc.__cause__ or exc.__context__
        seen += 1
    return False


def need_space(root: Path, report: RepairReport, needed: int, what: str) -> None:
    """Refuse (as the disk would, with ENOSPC) before starting to write what does not fit."""
    report.space_for, report.space_needed = what, needed
    free = shutil.disk_usage(sidecar_dir(root) if sidecar_dir(root).is_dir() else root).free
    if free < needed:
        raise OSError(errno.ENOSPC, f"{what} needs about {needed} bytes, {free} are free", str(root))


def free_inodes(root: Path) -> int | None:
    stat = os.statvfs(sidecar_dir(root) if sidecar_dir(root).is_dir() else root)
    return int(stat.f_favail) if stat.f_files else None  # None: the file system has no inode limit


def no_space_message(root: Path, report: RepairReport, inodes_left: int | None) -> str:
    where = sidecar_dir(root) if sidecar_dir(root).is_dir() else root
    free = shutil.disk_usage(where).free
    need = report.space_needed
    text = f"not enough disk space on the file system of {root}: {report.space_for}"
    if inodes_left == 0:
        text += f" needs new files and no inode was left ({free} bytes are free): delete some files"
    elif need > free:
        text += f" needs about {need} bytes, {free} are free: free at least {need - free} bytes"
    else:
        text += f" ran out of space ({free} bytes free now; it needs about {need}): free more"
    return (
        text + " and run 'hilrec repair' again. Nothing was lost: the dataset's files were left as they were."
    )


def merge_bytes(root: Path, state: ConsolidatedState, pending: Sequence[int]) -> int:
    """What a merge of ``pending`` writes at most: new versions of the last files, plus the episodes."""
    total = SPACE_SLACK_BYTES + SPACE_PER_EPISODE_BYTES * (len(state.episodes) + len(pending))
    last = state.episodes[-1] if state.episodes else None
    files = [data_path(root, data_ref(last))] if last else []
    keys = video_keys(state.info["features"])
    files += [video_path(root, key, video_ref(last, key)) for key in keys] if last else []
    for index in pending:
        directory = journal.episode_dir(root, index)
        files += [directory / journal.EPISODE_DATA, *(directory / journal.video_file_name(k) for k in keys)]
    return total + sum(p.stat().st_size for p in files if p.exists())
