"""The room held back on the disk for saving the open take, and the end of a take the disk fills under.

A take whose disk fills while it records must end at a whole frame and still be saved: its rows,
sidecar and the last of its video are written at the save, when the disk may have nothing left.
So each open episode holds a file in its open directory (``.reserve``), allocated ahead of the
frames (``posix_fallocate``, so the blocks are the file system's answer, not an estimate) to what
saving the take so far needs, and grown once a second (:data:`GROW_EVERY_S`) to :data:`AHEAD_S`
ahead. The save deletes it first, and writes into the room it gave back.

:meth:`TakeReserve.check` ends the take (:class:`DiskFullError`) at the frame where the reserve
cannot grow, or the disk's free space falls under :meth:`TakeReserve.low_water` (what the
encoders may still write until the save: a second of raw frames and a margin), so the frames
taken so far are kept whoever filled the disk, as long as what is left holds the encoders' next
writes: a disk another process fills to its last byte between two frames fails the thread
encoder's next write of the mp4, and that take is lost (the reserve holds the save's room, not
the encoders').
"""

from __future__ import annotations

import contextlib
import errno
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

from hilrec.daemon.dataset.format.features import is_video
from hilrec.daemon.dataset.format.layout import MB, row_bytes
from hilrec.daemon.dataset.writer.space import size_text
from hilrec.daemon.errors import DiskFullError

RESERVE_NAME: Final[str] = ".reserve"
# The reserve is grown at most this often, to this far ahead of the frames.
GROW_EVERY_S: Final[float] = 1.0
AHEAD_S: Final[float] = 3.0
# A save's bytes beside its rows: episode.json, meta rows, stats, the sidecar JSON, parquet's
# own overhead; and the sidecar arrays per frame (tick times, flags, leader, twin joints).
FIXED_BYTES: Final[int] = 2 * MB
SIDECAR_BYTES_PER_FRAME: Final[int] = 256
# Free space under which a take ends, beside the encoders' second of raw frames.
LOW_WATER_BYTES: Final[int] = 2 * MB


class TakeReserve:
    """The reserve file of one open episode (see the module docstring)."""

    def __init__(self, directory: Path, *, fps: int, features: Mapping[str, Any]) -> None:
        self.path = directory / RESERVE_NAME
        self.fps = fps
        self._per_frame = 2 * row_bytes(features) + SIDECAR_BYTES_PER_FRAME
        self._raw_frame = sum(
            int(spec["shape"][0]) * int(spec["shape"][1]) * 3 for spec in features.values() if is_video(spec)
        )
        self._held = 0
        self._grown_at = -1
        self._fd: int | None = None

    @property
    def held(self) -> int:
        return self._held

    def low_water(self) -> int:
        """Free bytes under which the take ends: what the encoders may write before the save."""
        return LOW_WATER_BYTES + self.fps * self._raw_frame

    def need(self, frames: int, unencoded_bytes: int) -> int:
        """Bytes saving a take of ``frames`` frames needs beside its staged video; with the raw
        frames an encoder still holds in memory (they go into the spill at the save)."""
        return FIXED_BYTES + frames * self._per_frame + unencoded_bytes

    def check(self, *, root: Path, index: int, length: int, unencoded_bytes: int) -> None:
        """Grow the reserve when due and raise :class:`DiskFullError` when frame ``length``
        may not be taken: the reserve cannot grow, or the disk is under its low water."""
        if self._grown_at < 0 or length - self._grown_at >= max(1, round(self.fps * GROW_EVERY_S)):
            target = self.need(length + round(self.fps * AHEAD_S), unencoded_bytes)
            try:
                self._grow(target)
            except OSError as exc:
                if exc.errno == errno.EFBIG:
                    # A limit on one file's size (RLIMIT_FSIZE), not a lack of room: the take
                    # goes on without the reserve, as a writer did before there was one.
                    self._grown_at = length
                    return
                if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
                    raise
                raise DiskFullError(
                    self._ended(root, index, length, f"{size_text(target)} cannot be held back for its save")
                ) from exc
            self._grown_at = length
        free = _free(root)
        if free is not None and free < self.low_water():
            why = f"{size_text(free)} free, under the {size_text(self.low_water())} its encoders need"
            raise DiskFullError(self._ended(root, index, length, why))

    def release(self) -> None:
        """Give the held room back (the save writes into it); idempotent."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()
        self._held = 0

    def _grow(self, target: int) -> None:
        if target <= self._held:
            return
        if self._fd is None:
            self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o644)
        os.posix_fallocate(self._fd, 0, target)
        self._held = target

    def _ended(self, root: Path, index: int, length: int, why: str) -> str:
        kept = (
            f"its {length} frames fit the {size_text(self._held)} held back for its save"
            if length
            else "it has no frame to save"
        )
        return (
            f"{root}: the disk is full ({why}): episode {index} ends at frame {length}, {kept}; "
            "free disk space before the next take"
        )


def _free(root: Path) -> int | None:
    try:
        stat = os.statvfs(root)
    except OSError:
        return None
    return stat.f_bavail * stat.f_frsize
