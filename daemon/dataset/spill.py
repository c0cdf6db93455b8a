"""The video spill: raw camera frames on disk, in the episode's journal directory, until its mp4 is done.

With the encoder in its own process (:mod:`.encoder_process`) a slow codec (LeRobot's libsvtav1
on a small machine) falls behind the camera. Frames never wait in RAM for it and are never
dropped: the writer appends every frame of a camera, raw, to ``<key>.spill`` in the episode's
open directory (``.episode-NNNNNN.tmp/``, see :mod:`.journal`), ``H*W*3`` bytes each, frame ``i``
at offset ``i*H*W*3`` — no header, no container, nothing to tear but a last partial frame. Beside
it, ``spill.json`` names the cameras, their shapes, the fps and the encoder settings, so the encode
can be finished by anyone later with the same settings (and the same bytes).

The encoder process streams the mp4 into the same directory, ``<key>.mp4``, as the in-process
encoder does. Saving an episode whose encoder has not finished commits the spill with the rest
(the commit fsyncs every file of the directory: the spill *is* part of the journal entry), so
``save_episode`` returns durable without waiting for the mp4; the worker goes on writing the
same file, through the rename. A spill beside an mp4 means the mp4 is not finished: once the
worker has closed and fsynced it, the writer deletes the spill (:func:`release_spill`) and only
then is the episode merged.

After a crash, :func:`finish_spilled_encodes` (called by ``DatasetWriter.open`` before its
recovery, and to be called by ``hilrec repair`` before its own) encodes every committed
episode's remaining spills into its mp4, then removes the spills and stray ``.encode-*`` files.
An open (never saved) episode's spill is left to the recovery, which drops the episode.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Final

import numpy as np

from hilrec.daemon.atomic import fsync_dir, fsync_file, json_bytes, read_json, write_synced
from hilrec.daemon.dataset import journal
from hilrec.daemon.errors import CorruptDatasetError, VideoEncodingError

log = logging.getLogger(__name__)

SPILL_META: Final[str] = "spill.json"
SPILL_SUFFIX: Final[str] = ".spill"
SPILL_FORMAT: Final[int] = 1
ENCODE_PREFIX: Final[str] = ".encode-"
_ENCODE = re.compile(r"^\.encode-(\d{6,})-(.+)\.mp4$")


def spill_name(key: str) -> str:
    return key + SPILL_SUFFIX


def encode_temp_path(root: Path, episode_index: int, key: str) -> Path:
    """Where :func:`encode_from_spill` writes an episode's mp4 until it is placed."""
    return journal.journal_dir(root) / f"{ENCODE_PREFIX}{episode_index:06d}-{key}.mp4"


class SpillFile:
    """One camera's spill of one episode: raw frames appended, fsynced when the episode is saved."""

    def __init__(self, path: Path, frame_bytes: int) -> None:
        self.path = path
        self.frame_bytes = frame_bytes
        self.frames = 0
        self._fd: int | None = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)

    @property
    def bytes(self) -> int:
        return self.frames * self.frame_bytes

    def append(self, image: np.ndarray) -> None:
        if self._fd is None:
            raise VideoEncodingError(f"{self.path}: spill is closed")
        view = memoryview(np.ascontiguousarray(image, dtype=np.uint8).data).cast("B")
        if len(view) != self.frame_bytes:
            raise VideoEncodingError(f"{self.path}: frame of {len(view)} bytes, expected {self.frame_bytes}")
        written = 0
        while written < len(view):
            written += os.write(self._fd, view[written:])
        self.frames += 1

    def sync(self) -> None:
        if self._fd is not None:
            os.fsync(self._fd)

    def close(self) -> None:
        if self._fd is not None:
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
    directory: Path, *, fps: int, cameras: Mapping[str, tuple[int, int]], settings: Any
) -> None:
    payload = {
        "format": SPILL_FORMAT,
        "fps": fps,
        "cameras": {key: [h, w] for key, (h, w) in cameras.items()},
        "settings": settings.to_json(),
    }
    write_synced(directory / SPILL_META, json_bytes(payload, indent=None, final_newline=False))


def release_spill(directory: Path, key: str) -> None:
    """``<key>.mp4`` in ``directory`` is finished and fsynced: delete the camera's spill (and
    ``spill.json`` with the last one). Durable on return."""
    (directory / spill_name(key)).unlink(missing_ok=True)
    if not any(child.name.endswith(SPILL_SUFFIX) for child in directory.iterdir()):
        (directory / SPILL_META).unlink(missing_ok=True)
    fsync_dir(directory)


def place_finished_video(root: Path, episode_index: int, key: str, source: Path) -> Path:
    """Move a finished (fsynced) mp4 over the committed episode's ``<key>.mp4`` (an unfinished
    one a crash left) and release its spill. Durable on return."""
    directory = journal.episode_dir(root, episode_index)
    target = directory / journal.video_file_name(key)
    os.replace(source, target)
    fsync_dir(directory)
    release_spill(directory, key)
    return target


def pending_spills(root: Path) -> list[tuple[int, str]]:
    """(episode_index, camera key) of every committed episode's spill whose mp4 is not done."""
    found = []
    for index in journal.committed_dirs(root):
        directory = journal.episode_dir(root, index)
        for child in sorted(directory.iterdir()):
            if child.name.endswith(SPILL_SUFFIX):
                found.append((index, child.name[: -len(SPILL_SUFFIX)]))
    return found


def finish_spilled_encodes(
    root: str | os.PathLike[str], *, progress: Callable[[int], None] | None = None
) -> list[str]:
    """Finish every committed episode's unfinished encode from its spill; return what was done.

    For ``hilrec repair`` (before its recovery: an episode with a spill has no mp4 yet) and
    ``DatasetWriter.open``. Needs the root's lock held by the caller (or no writer). Encodes with
    the settings the spill records, writes ``.encode-NNNNNN-<key>.mp4``, fsyncs it, and places it
    (:func:`place_finished_video`). Stray ``.encode-*`` files of an interrupted encode are
    removed first. ``progress(frames)`` is called after each frame encoded.
    """
    root = Path(root)
    actions: list[str] = []
    jdir = journal.journal_dir(root)
    if not jdir.is_dir():
        return actions
    for child in jdir.iterdir():
        if _ENCODE.match(child.name):
            child.unlink()
            actions.append(f"removed interrupted encode {child.name}")
    for index, key in pending_spills(root):
        length = encode_from_spill(root, index, key, progress=progress)
        actions.append(f"finished the encode of episode {index} '{key}' from its spill ({length} frames)")
    return actions


def encode_from_spill(
    root: Path, index: int, key: str, *, progress: Callable[[int], None] | None = None
) -> int:
    """Encode committed episode ``index``'s camera ``key`` from its spill and place the mp4
    (:func:`place_finished_video`); returns the frames encoded."""
    from hilrec.daemon.dataset.video import StreamEncoder, VideoSettings, probe_video

    directory = journal.episode_dir(root, index)
    meta = read_json(directory / SPILL_META, what="spill description")
    if not isinstance(meta, dict) or key not in meta.get("cameras", {}):
        raise CorruptDatasetError(str(directory / SPILL_META), f"does not describe camera '{key}'")
    height, width = meta["cameras"][key]
    fps = int(meta["fps"])
    settings = VideoSettings.from_json(meta["settings"])
    length = int(journal.load_episode_meta(root, index)["length"])
    frame_bytes = height * width * 3
    spill = directory / spill_name(key)
    size = spill.stat().st_size
    if size < length * frame_bytes:
        raise CorruptDatasetError(
            str(spill), f"holds {size // frame_bytes} whole frames, episode {index} has {length}"
        )
    out = encode_temp_path(root, index, key)
    encoder = StreamEncoder(out, fps=fps, height=height, width=width, settings=settings)
    try:
        with open(spill, "rb") as f:
            for _ in range(length):
                data = f.read(frame_bytes)
                encoder.encode(np.frombuffer(data, dtype=np.uint8).reshape(height, width, 3))
                if progress is not None:
                    progress(1)
        encoder.close()
    except BaseException:
        encoder.abort()
        out.unlink(missing_ok=True)
        raise
    fsync_file(out)
    frames = probe_video(out).frames
    if frames != length:
        out.unlink()
        raise VideoEncodingError(f"{out}: {frames} frames encoded from {spill}, episode has {length}")
    place_finished_video(root, index, key, out)
    log.warning("%s: episode %d '%s': encoded from its spill (%d frames)", root, index, key, length)
    return length
