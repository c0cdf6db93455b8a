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

After a crash, :func:`finish_spilled_encodes` (called by ``DatasetWriter.open`` before its
recovery, and by ``hilrec repair`` before its own) encodes every committed episode's remaining
spills into its mp4 (frames ``[c, n)`` from the spill after the ``c`` frames of ``<key>.mp4``),
then removes the spills and stray ``.encode-*`` files. An open (never saved) episode's spill is
left to the recovery, which drops the episode.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import threading
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, Final

import numpy as np

from hilrec.daemon.atomic import fsync_dir, fsync_file, json_bytes, read_json, write_synced
from hilrec.daemon.dataset import journal
from hilrec.daemon.errors import CorruptDatasetError, VideoEncodingError

log = logging.getLogger(__name__)

# What each thread is finishing from a spill right now (see finishing()): the thread that waits
# for a writer to open tells a long open (a crash's backlog encoded) from a stuck one.
_finishing: dict[int, str] = {}
_finishing_lock = threading.Lock()


def finishing(thread_ident: int | None) -> str | None:
    """What thread ``thread_ident`` is finishing from a spill now ("finishing 4 s of video
    from the spill of episode 3 'cam'"), or None."""
    with _finishing_lock:
        return _finishing.get(thread_ident) if thread_ident is not None else None


@contextlib.contextmanager
def _noted(what: str) -> Iterator[None]:
    ident = threading.get_ident()
    with _finishing_lock:
        _finishing[ident] = what
    try:
        yield
    finally:
        with _finishing_lock:
            _finishing.pop(ident, None)


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
        what = f"finishing {_spill_seconds(root, index)} of video from the spill of episode {index} '{key}'"
        log.warning("%s: %s", root, what)
        with _noted(what):
            length = encode_from_spill(root, index, key, progress=progress)
        actions.append(f"finished the encode of episode {index} '{key}' from its spill ({length} frames)")
    return actions


def _spill_seconds(root: Path, index: int) -> str:
    """The length of committed episode ``index`` in seconds, as text ("? s" if unreadable:
    encode_from_spill then says what is wrong)."""
    try:
        meta = read_json(journal.episode_dir(root, index) / SPILL_META, what="spill description")
        length = int(journal.load_episode_meta(root, index)["length"])
        return f"{length / int(meta['fps']):.1f} s"
    except (CorruptDatasetError, OSError, KeyError, TypeError, ValueError, ZeroDivisionError):
        return "? s"


def encode_from_spill(
    root: Path, index: int, key: str, *, progress: Callable[[int], None] | None = None
) -> int:
    """Encode committed episode ``index``'s camera ``key`` from its spill and place the mp4
    (:func:`place_finished_video`); returns the frames of the episode.

    Frames ``[c, n)`` come from the spill, where ``c`` is the camera's cut in ``spill.json``
    (0 when missing); the first ``c`` are ``<key>.mp4``'s, joined by packet copy. An mp4 that
    already holds every frame (the worker finished, the spill's release did not) is kept."""
    from hilrec.daemon.dataset.video import (
        Segment,
        StreamEncoder,
        VideoSettings,
        concat_segments,
        probe_video,
    )

    directory = journal.episode_dir(root, index)
    meta = read_json(directory / SPILL_META, what="spill description")
    if not isinstance(meta, dict) or key not in meta.get("cameras", {}):
        raise CorruptDatasetError(str(directory / SPILL_META), f"does not describe camera '{key}'")
    height, width = meta["cameras"][key]
    fps = int(meta["fps"])
    settings = VideoSettings.from_json(meta["settings"])
    cut = int(meta.get("cuts", {}).get(key, 0))
    length = int(journal.load_episode_meta(root, index)["length"])
    target = directory / journal.video_file_name(key)
    head = _frames_in(target)
    if head == length:
        release_spill(directory, key)
        return length
    if cut > 0 and head != cut:
        raise CorruptDatasetError(str(target), f"holds {head} frames, its spill starts at frame {cut}")
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
            f.seek(cut * frame_bytes)
            for _ in range(cut, length):
                data = f.read(frame_bytes)
                encoder.encode(np.frombuffer(data, dtype=np.uint8).reshape(height, width, 3))
                if progress is not None:
                    progress(1)
        encoder.close()
    except BaseException:
        encoder.abort()
        out.unlink(missing_ok=True)
        raise
    if cut > 0:
        joined = out.with_name(out.name[: -len(".mp4")] + ".j.mp4")
        try:
            concat_segments(joined, [Segment(target), Segment(out)], fps=fps)
        finally:
            out.unlink(missing_ok=True)
        out = joined
    fsync_file(out)
    frames = probe_video(out).frames
    if frames != length:
        out.unlink()
        raise VideoEncodingError(f"{out}: {frames} frames encoded from {spill}, episode has {length}")
    place_finished_video(root, index, key, out)
    log.warning("%s: episode %d '%s': encoded from its spill (%d frames)", root, index, key, length - cut)
    return length


def _frames_in(path: Path) -> int:
    """Frames of a finished mp4; -1 when it is missing or unfinished (no index yet)."""
    from hilrec.daemon.dataset.video import probe_video

    try:
        return probe_video(path).frames
    except CorruptDatasetError:
        return -1
