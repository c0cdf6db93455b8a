"""Free space: whether the root's file system holds one more take, sized from the recent ones.

:class:`TakeSizes` remembers the frames and bytes of the episodes a writer encoded lately and
sizes the next take from them (see :meth:`TakeSizes.estimate`); :func:`space_problem` turns that
into the sentence the daemon refuses a take with. Both are cheap (one ``statvfs`` and a few
``stat`` calls) and safe from any thread.
"""

from __future__ import annotations

import contextlib
import os
from collections import deque
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Final

from hilrec.daemon.dataset.format.features import is_video
from hilrec.daemon.dataset.format.layout import MB, row_bytes
from hilrec.daemon.dataset.format.paths import (
    data_path,
    data_ref,
    episodes_path,
    episodes_ref,
    video_path,
    video_ref,
)
from hilrec.daemon.dataset.store.consolidate import ConsolidatedState

# space_problem(): never ask for less than this, whatever the estimate says.
MIN_FREE_BYTES: Final[int] = 64 * MB
# Until an episode is measured: a take of this long, video at this many bits per pixel (AV1 at
# LeRobot's crf 30 stays well below it on camera images; noise needs more, and is measured then).
DEFAULT_TAKE_S: Final[float] = 60.0
VIDEO_BITS_PER_PIXEL: Final[float] = 0.5
# The recent episodes space_problem() sizes the next take from.
RECENT_EPISODES: Final[int] = 20


class TakeSizes:
    """(frames, bytes on disk) of the episodes encoded lately, and the next take's estimate."""

    def __init__(self, root: Path, *, fps: int, features: Mapping[str, Any], lengths: Iterable[int]) -> None:
        self.root = root
        self.fps = fps
        self.features = features
        self._recent: deque[tuple[int, int]] = deque(maxlen=RECENT_EPISODES)
        self.lengths: deque[int] = deque(lengths, maxlen=RECENT_EPISODES)

    def remember(self, frames: int, size: int) -> None:
        self._recent.append((frames, size))
        self.lengths.append(frames)

    def estimate(
        self, *, open_length: int, open_directory: Path | None, merged: ConsolidatedState, held: int
    ) -> tuple[int, str]:
        """Bytes one more take needs, and how that was reckoned (see the writer's
        :meth:`~.writer.DatasetWriter.space_needed`)."""
        recent = list(self._recent)
        frames = max([*self.lengths, open_length])
        if frames == 0:
            frames = round(self.fps * DEFAULT_TAKE_S)
        merged_per_frame, copy = _merged_files(self.root, self.features, merged)
        measured = [size / length for length, size in recent if length] + merged_per_frame
        if measured:
            per_frame, source = max(measured), "measured"
        else:
            per_frame = row_bytes(self.features) + sum(
                spec["shape"][0] * spec["shape"][1] * VIDEO_BITS_PER_PIXEL / 8
                for spec in self.features.values()
                if is_video(spec)
            )
            source = "estimated"
        take = round(frames * per_frame)
        staged = dir_bytes(open_directory) if open_directory is not None else 0
        need = max(MIN_FREE_BYTES, 2 * take + copy + held - staged)
        how = (
            f"{frames} frames x {per_frame:.0f} bytes per frame ({source}), twice while it is "
            f"merged, plus {copy} bytes for the merge's copy of the files it appends to"
        )
        if held:
            how += f" and {held} bytes of saves waiting for a retry"
        if need == MIN_FREE_BYTES:
            how += f"; at least {size_text(MIN_FREE_BYTES)}"
        return need, how


def space_problem(root: Path, need: int, how: str) -> str | None:
    """Why the file system of ``root`` may not hold ``need`` bytes, or None when it has room.
    Free is what an unprivileged writer may use (``statvfs``: ``f_bavail * f_frsize``)."""
    try:
        stat = os.statvfs(root)
    except OSError as exc:
        return f"{root}: its free space cannot be read ({exc.strerror})"
    free = stat.f_bavail * stat.f_frsize
    if free >= need:
        return None
    return (
        f"{root}: {size_text(free)} free ({free} bytes) but one more take needs "
        f"{size_text(need)} ({need} bytes; {how}); free disk space or record to another disk"
    )


def _merged_files(
    root: Path, features: Mapping[str, Any], state: ConsolidatedState
) -> tuple[list[float], int]:
    """Bytes per frame of the files the last merged episode is in, and their total size."""
    if not state.episodes:
        return [], 0
    last = state.episodes[-1]
    files: list[tuple[Path, Any]] = [(data_path(root, data_ref(last)), data_ref)]
    for key, spec in features.items():
        if is_video(spec):
            files.append((video_path(root, key, video_ref(last, key)), _video_ref_of(key)))
    per_frame = 0.0
    total = 0
    for path, ref_of in files:
        try:
            size = path.stat().st_size
        except OSError:
            continue
        ref = ref_of(last)
        frames = sum(int(row["length"]) for row in state.episodes if ref_of(row) == ref)
        per_frame += size / max(1, frames)
        total += size
    with contextlib.suppress(OSError):
        total += episodes_path(root, episodes_ref(last)).stat().st_size
    return [per_frame], total


def _video_ref_of(key: str) -> Any:
    return lambda row: video_ref(row, key)


def dir_bytes(directory: Path) -> int:
    total = 0
    try:
        for child in directory.iterdir():
            total += child.stat().st_blocks * 512  # on disk: a spill is sparse
    except OSError:
        pass
    return total


def size_text(n: int) -> str:
    return f"{n / MB:.1f} MiB"
