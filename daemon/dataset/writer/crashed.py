"""The take a crash interrupted, saved up to its last checkpoint, marked ``ended_by: crash``.

A writer killed with an episode open leaves its open directory (``.episode-NNNNNN.tmp/``) with
the rows of its last checkpoint (:mod:`.checkpoint`) and each camera's fragmented mp4, readable up
to its last whole fragment. ``hilrec repair`` keeps that much of the take:

1. :func:`set_aside` (under the root's lock, before the repair runs): every open directory whose
   checkpoint holds rows is moved to ``hilrec/crashed/episode-NNNNNN/``, with the number of frames
   every part of it holds (the rows, bounded by each camera's decodable frames); the repair then
   no longer sees it as an open episode to drop.
2. :func:`save_crashed` (once the repair has left a dataset ``hilrec check`` accepts): each take is
   recorded again through a :class:`~.writer.DatasetWriter` of the root, frame by frame (its rows,
   its frames decoded from the mp4, so its stats and numbering are the writer's own), and saved
   with a sidecar saying ``ended_by: crash`` and what was kept; its folder is deleted after.

An open directory with no checkpoint (an episode under a second long, or a writer from before
checkpoints) is left where it is, for the repair to drop as before.
"""

from __future__ import annotations

import logging
import os
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import numpy as np

from hilrec.daemon.atomic import fsync_dir, read_json
from hilrec.daemon.dataset.format.features import video_keys
from hilrec.daemon.dataset.format.paths import INFO_PATH
from hilrec.daemon.dataset.format.sidecar import sidecar_dir
from hilrec.daemon.dataset.store import journal
from hilrec.daemon.dataset.store.rootlock import RootLock
from hilrec.daemon.dataset.video.avlog import open_av
from hilrec.daemon.dataset.writer.checkpoint import read_rows
from hilrec.daemon.errors import CorruptDatasetError

log = logging.getLogger(__name__)

CRASHED_DIR: Final[str] = "crashed"
ENDED_BY_CRASH: Final[str] = "crash"
# A dataset's video codec, as its info.json names it, and the encoder that writes it.
ENCODER_OF_CODEC: Final[dict[str, str]] = {"av1": "libsvtav1", "h264": "libx264", "hevc": "libx265"}


@dataclass(frozen=True)
class CrashedTake:
    """An open episode set aside: where, which index it had, the frames kept of it and why."""

    directory: Path
    index: int
    frames: int
    rows: int
    video_frames: dict[str, int]


def crashed_dir(root: Path) -> Path:
    return sidecar_dir(root) / CRASHED_DIR


def set_aside(root: Path) -> list[CrashedTake]:
    """Move every open episode with checkpointed rows out of the journal (see the module
    docstring); the takes set aside, by episode index, including those of an earlier run."""
    try:
        info = read_json(root / INFO_PATH, what="info.json")
        cameras = video_keys(info["features"])
    except (CorruptDatasetError, KeyError, TypeError, AttributeError):
        # The repair rebuilds an unreadable info.json; without it no take can be measured,
        # so an open one is left for the repair to drop, as before.
        return []
    with RootLock(root, "hilrec repair"):
        for index in journal.open_episodes(root):
            source = journal.open_episode_dir(root, index)
            if _measure(source, index, cameras) is None:
                continue
            target = crashed_dir(root) / source.name.strip(".").removesuffix(".tmp")
            target.parent.mkdir(parents=True, exist_ok=True)
            if target.exists():
                shutil.rmtree(target)
            os.replace(source, target)
            fsync_dir(target.parent)
            fsync_dir(source.parent)
    takes = []
    for directory in sorted(crashed_dir(root).glob("episode-*")) if crashed_dir(root).is_dir() else []:
        index = int(directory.name.rsplit("-", 1)[1])
        take = _measure(directory, index, cameras)
        if take is not None:
            takes.append(take)
    return takes


def save_crashed(root: Path, takes: list[CrashedTake]) -> list[str]:
    """Record each take again into the dataset and save it (see the module docstring); one
    sentence per take for the report."""
    if not takes:
        return []
    from hilrec.daemon.dataset.writer.dataset_writer import DatasetWriter

    info = read_json(root / INFO_PATH, what="info.json")
    features: dict[str, Any] = info["features"]
    cameras = video_keys(features)
    codec = next(
        (ENCODER_OF_CODEC.get(str(features[key].get("info", {}).get("video.codec"))) for key in cameras),
        None,
    )
    lines = []
    writer = DatasetWriter.open(
        root, video_codec=codec or "libsvtav1", video_encoder="thread", lock_command="hilrec repair"
    )
    try:
        for take in takes:
            columns, tasks = read_rows(take.directory)
            frames = {key: _decoded(take.directory / journal.video_file_name(key)) for key in cameras}
            for i in range(take.frames):
                frame: dict[str, Any] = {key: values[i] for key, values in columns.items() if key in features}
                frame["task"] = tasks[i]
                for key in cameras:
                    frame[key] = next(frames[key])
                writer.add_frame(frame)
            index = writer.save_episode(sidecar=_sidecar(take, tasks[0]))
            shutil.rmtree(take.directory)
            lines.append(
                f"episode {index}: the take open at the crash (episode {take.index} then), kept up to "
                f"its last checkpoint: {take.frames} frames (rows {take.rows}, video "
                + ", ".join(f"{key.rsplit('.', 1)[-1]} {n}" for key, n in take.video_frames.items())
                + "), ended_by: crash"
            )
    finally:
        writer.finalize()
    return lines


def _sidecar(take: CrashedTake, task: str) -> dict[str, Any]:
    return {
        "recorder": "hilrec repair",
        "task": task,
        "ended_by": ENDED_BY_CRASH,
        "frames": take.frames,
        "crash": {
            "episode_index_when_open": take.index,
            "rows_checkpointed": take.rows,
            "video_frames": dict(take.video_frames),
            "kept": "the rows of the last checkpoint, as far as every camera's mp4 could be read",
        },
    }


def _measure(directory: Path, index: int, cameras: list[str]) -> CrashedTake | None:
    try:
        _columns, tasks = read_rows(directory)
    except CorruptDatasetError as exc:
        log.warning("%s: its checkpoint cannot be read (%s); left for the repair", directory, exc)
        return None
    if not tasks:
        return None
    videos = {key: _count_decodable(directory / journal.video_file_name(key)) for key in cameras}
    frames = min([len(tasks), *videos.values()])
    if frames == 0:
        return None
    return CrashedTake(directory, index, frames, len(tasks), videos)


def _count_decodable(path: Path) -> int:
    count = 0
    for _ in _decoded(path):
        count += 1
    return count


def _decoded(path: Path) -> Iterator[np.ndarray]:
    """The frames of a (maybe torn) fragmented mp4, in order, until the first it cannot read."""
    if not path.exists():
        return
    try:
        container = open_av(str(path))
    except Exception as exc:  # noqa: BLE001 - PyAV's errors for a torn file are many: none is a frame
        log.warning("%s: unreadable (%s)", path, exc)
        return
    try:
        for frame in container.decode(video=0):
            yield frame.to_ndarray(format="rgb24")
    except Exception as exc:  # noqa: BLE001 - a torn last fragment ends the frames there
        log.info("%s: frames end at a torn fragment (%s)", path, exc)
    finally:
        container.close()
