"""Finishing the encodes that committed episodes' spills hold (after a crash, or a writer behind).

An episode saved while its encoder was behind is committed with its spill (see
:mod:`hilrec.daemon.dataset.video.spill`). :func:`finish_spilled_encodes`, called by
``DatasetWriter.open`` before its recovery and by ``hilrec repair`` before its own, encodes every
committed episode's remaining spills into its mp4 (frames ``[c, n)`` from the spill after the
``c`` frames of ``<key>.mp4``), then removes the spills and stray ``.encode-*`` files. An open
(never saved) episode's spill is left to the recovery, which drops the episode.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np

from hilrec.daemon.atomic import fsync_dir, fsync_file, read_json
from hilrec.daemon.dataset.store import journal
from hilrec.daemon.dataset.video.spill import (
    ENCODE_PREFIX,
    SPILL_META,
    SPILL_SUFFIX,
    release_spill,
    spill_name,
)
from hilrec.daemon.errors import CorruptDatasetError, VideoEncodingError

log = logging.getLogger(__name__)

_ENCODE = re.compile(r"^\.encode-(\d{6,})-(.+)\.mp4$")

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


def encode_temp_path(root: Path, episode_index: int, key: str) -> Path:
    """Where :func:`encode_from_spill` writes an episode's mp4 until it is placed."""
    return journal.journal_dir(root) / f"{ENCODE_PREFIX}{episode_index:06d}-{key}.mp4"


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
    from hilrec.daemon.dataset.video.codec import (
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
    from hilrec.daemon.dataset.video.codec import probe_video

    try:
        return probe_video(path).frames
    except CorruptDatasetError:
        return -1
