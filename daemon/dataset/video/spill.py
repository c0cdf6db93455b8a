"""The video spill: raw camera frames in the episode's journal directory while the encoder is behind.

With the encoder in its own process (:mod:`.encoder_process`) a slow codec (LeRobot's libsvtav1
on a small machine) can fall behind the camera. Frames never wait in RAM for it and are never
dropped: a frame the shared-memory ring cannot take is written, raw, into ``<key>.spill`` in the
episode's open directory (``.episode-NNNNNN.tmp/``, see :mod:`.journal`), ``H*W*3`` bytes, frame
``i`` at offset ``i*H*W*3`` (a sparse file: no header, no container, nothing to tear but a frame
being written). Beside it, ``spill.json`` names the cameras, their shapes, the fps and the encoder
settings, so the encode can be finished by anyone later with the same settings.

An episode that falls behind is *cut* (see :mod:`.encoder_process`): ``<key>.mp4`` is closed at
frame ``c`` and every frame from ``c`` on is in the spill. Saving an episode whose encoder has not
finished writes the frames still in the ring into the spill, records ``c`` in ``spill.json``
(``cuts``) and commits the spill with the rest (the commit fsyncs every file of the directory:
the spill *is* part of the journal entry), so ``save_episode`` returns durable without waiting for
the mp4. A spill beside an mp4 means the mp4 is not finished: once the worker has joined and
fsynced it, the writer deletes the spill (:func:`release_spill`) and only then is the episode
merged. An episode that is never behind has an empty spill, deleted at its save.

This module is the spill's file format, shared by the encoder processes and the writer. After
a crash, :mod:`hilrec.daemon.dataset.store.spilled` finishes the encodes that committed
episodes' spills hold.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

import numpy as np

from hilrec.daemon.atomic import fsync_dir, json_bytes, write_synced
from hilrec.daemon.errors import VideoEncodingError

SPILL_META: Final[str] = "spill.json"
SPILL_SUFFIX: Final[str] = ".spill"
SPILL_FORMAT: Final[int] = 1
ENCODE_PREFIX: Final[str] = ".encode-"


def spill_name(key: str) -> str:
    return key + SPILL_SUFFIX


def pwrite_all(fd: int, image: np.ndarray, offset: int) -> None:
    """Write one raw frame at ``offset`` (a short write is continued)."""
    view = memoryview(np.ascontiguousarray(image, dtype=np.uint8).data).cast("B")
    written = 0
    while written < len(view):
        written += os.pwrite(fd, view[written:], offset + written)


class SpillFile:
    """One camera's spill of one episode: raw frames written at their place, fsynced at the save."""

    def __init__(self, path: Path, frame_bytes: int) -> None:
        self.path = path
        self.frame_bytes = frame_bytes
        self.frames = 0  # written by this side (the encoder process tees more after a cut)
        # Bytes on disk as of the last refresh: read from any thread (the loop's status), so
        # it never touches the fd, which the writer thread closes.
        self._bytes = 0
        self._fd: int | None = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)

    @property
    def bytes(self) -> int:
        """Bytes on disk (the file is sparse: only frames written count), as of the last
        :meth:`refresh` (the writer's own writes refresh it)."""
        return self._bytes

    def refresh(self) -> None:
        """Count the bytes on disk again: the encoder process writes the spill too after a cut.
        The writer thread's (as are :meth:`write_at` and :meth:`close`)."""
        if self._fd is not None:
            self._bytes = os.fstat(self._fd).st_blocks * 512

    def write_at(self, frame_index: int, image: np.ndarray) -> None:
        if self._fd is None:
            raise VideoEncodingError(f"{self.path}: spill is closed")
        if image.nbytes != self.frame_bytes:
            raise VideoEncodingError(
                f"{self.path}: frame of {image.nbytes} bytes, expected {self.frame_bytes}"
            )
        pwrite_all(self._fd, image, frame_index * self.frame_bytes)
        self.frames += 1
        self.refresh()

    def append(self, image: np.ndarray) -> None:
        """Write the next frame after the ones this side wrote (a spill of every frame)."""
        self.write_at(self.frames, image)

    def sync(self) -> None:
        if self._fd is not None:
            os.fsync(self._fd)

    def close(self) -> None:
        if self._fd is not None:
            self.refresh()
            os.close(self._fd)
            self._fd = None


def read_spill_frame(
    path: Path, frame_index: int, frame_bytes: int, shape: tuple[int, int, int]
) -> np.ndarray:
    """Frame ``frame_index`` of a spill (the page cache has it while the encoder keeps close)."""
    with open(path, "rb", buffering=0) as f:
        data = os.pread(f.fileno(), frame_bytes, frame_index * frame_bytes)
    if len(data) != frame_bytes:
        raise VideoEncodingError(f"{path}: frame {frame_index} is not in the spill ({len(data)} bytes)")
    return np.frombuffer(data, dtype=np.uint8).reshape(shape)


def write_spill_meta(
    directory: Path,
    *,
    fps: int,
    cameras: Mapping[str, tuple[int, int]],
    settings: Any,
    cuts: Mapping[str, int] | None = None,
) -> None:
    """``spill.json``; ``cuts``: per camera, the first frame that is in the spill and not in
    ``<key>.mp4`` (0, or missing: every frame is in the spill)."""
    payload: dict[str, Any] = {
        "format": SPILL_FORMAT,
        "fps": fps,
        "cameras": {key: [h, w] for key, (h, w) in cameras.items()},
        "settings": settings.to_json(),
    }
    if cuts:
        payload["cuts"] = {key: int(c) for key, c in cuts.items()}
    write_synced(directory / SPILL_META, json_bytes(payload, indent=None, final_newline=False))


def release_spill(directory: Path, key: str) -> None:
    """``<key>.mp4`` in ``directory`` is finished and fsynced: delete the camera's spill (and
    ``spill.json`` with the last one). Durable on return."""
    (directory / spill_name(key)).unlink(missing_ok=True)
    if not any(child.name.endswith(SPILL_SUFFIX) for child in directory.iterdir()):
        (directory / SPILL_META).unlink(missing_ok=True)
    fsync_dir(directory)
