"""Taking a root for a writer: the lock, a new root's first files, a reopened root's recovery.

One writer per root: :func:`lock_empty_root` (for ``DatasetWriter.create``) and
:func:`lock_dataset_root` (for ``DatasetWriter.open``) take the root's exclusive lock
(:class:`~.rootlock.RootLock`) before anything in it is touched. :func:`write_new_root` writes a
new root's ``info.json`` and sidecar durably; :func:`settle_reopened_root` finishes what a crash
left (spilled encodes first, then the journal's recovery) before the writer starts.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from hilrec.daemon.atomic import fsync_dir
from hilrec.daemon.dataset.format.layout import empty_info, write_info
from hilrec.daemon.dataset.format.paths import INFO_PATH, META_DIR
from hilrec.daemon.dataset.format.sidecar import update_dataset_sidecar
from hilrec.daemon.dataset.store import journal
from hilrec.daemon.dataset.store.journal import Hook
from hilrec.daemon.dataset.store.rootlock import LOCK_NAME, RootLock, lock_path
from hilrec.daemon.dataset.store.spilled import finish_spilled_encodes
from hilrec.daemon.dataset.video.codec import VideoSettings
from hilrec.daemon.errors import CorruptDatasetError, DatasetError, DatasetStateError

log = logging.getLogger(__name__)


def check_layout_args(
    root: Path,
    *,
    fps: int,
    chunks_size: int,
    data_files_size_in_mb: float,
    video_files_size_in_mb: float,
    merge_interval_s: float,
) -> None:
    """Refuse a new dataset's arguments that LeRobot's layout cannot hold, naming the argument."""
    if not isinstance(fps, int) or isinstance(fps, bool) or fps <= 0:
        raise DatasetError(f"{root}: fps must be a positive int, got {fps!r}")
    for name, value in (
        ("chunks_size", chunks_size),
        ("data_files_size_in_mb", data_files_size_in_mb),
        ("video_files_size_in_mb", video_files_size_in_mb),
    ):
        if (
            isinstance(value, bool)
            or not isinstance(value, (int, float))
            or value <= 0
            or (name == "chunks_size" and not isinstance(value, int))
        ):
            raise DatasetError(f"{root}: {name} must be positive, got {value!r}")
    if not merge_interval_s >= 0:
        raise DatasetError(f"{root}: merge_interval_s must be >= 0, got {merge_interval_s!r}")


def provenance(name: str, settings: VideoSettings) -> dict[str, Any]:
    """The ``writer`` block of the dataset sidecar."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        hilrec_version = version("hilrec")
    except PackageNotFoundError:
        hilrec_version = "unknown"
    return {
        "name": name,
        "hilrec_version": hilrec_version,
        "video": settings.provenance(),
        "journal_format": journal.JOURNAL_FORMAT,
    }


def write_new_root(
    root: Path,
    writer: dict[str, Any],
    *,
    fps: int,
    features: dict[str, Any],
    robot_type: str | None,
    chunks_size: int,
    data_files_size_in_mb: float,
    video_files_size_in_mb: float,
) -> dict[str, Any]:
    """A new root's journal directory, sidecar and ``info.json``, durable; returns the info."""
    info = empty_info(
        fps=fps,
        features=features,
        robot_type=robot_type,
        chunks_size=chunks_size,
        data_files_size_in_mb=data_files_size_in_mb,
        video_files_size_in_mb=video_files_size_in_mb,
    )
    journal.journal_dir(root).mkdir(parents=True, exist_ok=True)
    update_dataset_sidecar(root, {"writer": writer})
    write_info(root, info)
    for directory in (journal.journal_dir(root).parent, root, root.parent):
        fsync_dir(directory)
    return info


def lock_dataset_root(root: Path, command: str | None) -> RootLock:
    """The lock of an existing dataset root; a directory that is no dataset is refused before
    a lock file is put into it."""
    if not ((root / META_DIR).is_dir() or journal.journal_dir(root).is_dir()):
        raise CorruptDatasetError(str(root / INFO_PATH), "missing: not a LeRobot dataset root")
    return RootLock(root, command).acquire()


def settle_reopened_root(root: Path, writer: dict[str, Any], hook: Hook = None) -> None:
    """Finish what the previous writer left (the lock held): saved episodes whose encode a crash
    interrupted get their mp4 from their spill first, so the recovery then merges them like any
    other; an episode open (never saved) when it died is dropped."""
    from hilrec.daemon.dataset.repair.recover import recover

    def progress(_frames: int) -> None:
        # After each frame encoded from a spill: tests slow the backlog down with it.
        if hook is not None:
            hook("spill-frame")

    for action in finish_spilled_encodes(root, progress=progress):
        log.warning("%s: %s", root, action)
    report = recover(root)
    if report.dropped:
        log.warning("%s: dropped on reopen: %s", root, report.dropped)
    update_dataset_sidecar(root, {"writer": writer})


def lock_empty_root(root: Path, command: str | None) -> RootLock:
    """The lock of a root that is missing or empty (but for a lock file left by an earlier
    writer). A non-empty root is refused; one being written names its writer."""
    lock = RootLock(root, command)
    if _has_entries(root):
        if lock_path(root).exists():
            lock.acquire()  # DatasetLockedError, naming the writer, if one holds it
            lock.release()
        raise DatasetStateError(
            f"{root}: already exists and is not empty; use DatasetWriter.open() to add episodes to it"
        )
    lock.acquire()
    if _has_entries(root):  # filled between the look and the lock
        lock.release()
        raise DatasetStateError(
            f"{root}: already exists and is not empty; use DatasetWriter.open() to add episodes to it"
        )
    return lock


def _has_entries(root: Path) -> bool:
    if not root.is_dir():
        return False  # missing: created; not a directory: RootLock says so
    return any(child.name != LOCK_NAME for child in root.iterdir())
