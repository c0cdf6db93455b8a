"""The open take made durable about once a second, so a crash costs at most a second of it.

While an episode is open its rows live in memory and its camera frames in the encoders. Every
:data:`CHECKPOINT_EVERY_S` of frames the writer (on its own thread, never the loop's) appends the
rows since the last checkpoint to the open directory as ``rows-<first frame>.npz`` (written,
fsynced, renamed) and fsyncs each camera's mp4. The mp4s of an open episode are fragmented
(:data:`~.codec.FRAGMENTED_MP4`: a fragment per keyframe, written through), so after a kill
each is readable up to its last whole fragment: :func:`durable_frames` is the rows checkpointed,
bounded by the frames each mp4 held when it was fsynced (the codec's own delay is the gap).

The encoder processes write their mp4 the same way; a frame that went to the spill instead is
not counted until the worker has encoded it (a cut episode counts its closed first part).

``hilrec repair`` reads what a checkpoint left with :func:`read_rows` (see :mod:`.crashed`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Final

import numpy as np

from hilrec.daemon.atomic import atomic_write_bytes, fsync_file, npz_bytes
from hilrec.daemon.errors import CorruptDatasetError

CHECKPOINT_EVERY_S: Final[float] = 1.0
ROWS_PREFIX: Final[str] = "rows-"
_ROWS_NAME = re.compile(r"rows-(\d{6,})\.npz")
TASK_KEY: Final[str] = "task"


def rows_name(first: int) -> str:
    return f"{ROWS_PREFIX}{first:06d}.npz"


def write_rows(
    directory: Path, first: int, columns: Mapping[str, Sequence[np.ndarray]], tasks: Sequence[str]
) -> None:
    """Rows ``first .. first + len(tasks) - 1`` of the open episode, durable when this returns."""
    arrays = {key: np.stack(values) for key, values in columns.items()}
    arrays[TASK_KEY] = np.asarray(tasks, dtype=np.str_)
    atomic_write_bytes(directory / rows_name(first), npz_bytes(arrays))


def sync_video(path: Path) -> None:
    """fsync an mp4 another thread or process is writing (a file not there yet is no error)."""
    if path.exists():
        fsync_file(path)


def read_rows(directory: Path) -> tuple[dict[str, np.ndarray], list[str]]:
    """Every checkpointed row of an open episode's directory, in order: the numeric columns
    ``(n, d)`` and the tasks. Stops at the first gap (a batch renamed after a later one cannot
    happen; a torn one never was renamed)."""
    batches = sorted(
        (int(match.group(1)), path)
        for path in directory.iterdir()
        if (match := _ROWS_NAME.fullmatch(path.name)) is not None
    )
    columns: dict[str, list[np.ndarray]] = {}
    tasks: list[str] = []
    for first, path in batches:
        if first != len(tasks):
            break
        try:
            with np.load(path, allow_pickle=False) as data:
                batch = {key: data[key] for key in data.files}
        except (OSError, ValueError) as exc:
            raise CorruptDatasetError(str(path), f"unreadable checkpoint: {exc}") from exc
        names = [str(task) for task in batch.pop(TASK_KEY)]
        for key, values in batch.items():
            if len(values) != len(names):
                raise CorruptDatasetError(str(path), f"{key} has {len(values)} rows for {len(names)} tasks")
            columns.setdefault(key, []).append(values)
        tasks.extend(names)
    return {key: np.concatenate(parts) for key, parts in columns.items()}, tasks
