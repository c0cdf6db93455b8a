"""Where LeRobot v3.0 keeps what, and the names it uses: the one source for both reader and writer.

- ``meta/info.json``, ``meta/stats.json``, ``meta/tasks.parquet``;
- ``meta/episodes/chunk-XXX/file-XXX.parquet``: one row per episode;
- ``data/chunk-XXX/file-XXX.parquet``: one row per frame;
- ``videos/<key>/chunk-XXX/file-XXX.mp4``: one or more episodes per file.

The writer places files with the templates below (they are also what it stores in info.json);
the reader follows the templates of the dataset's own info.json (:func:`data_file_path`,
:func:`video_file_path`), so it also reads a dataset whose templates differ.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from hilrec.daemon.errors import CorruptDatasetError

PathLike = str | os.PathLike[str]

CODEBASE_VERSION: Final[str] = "v3.0"

META_DIR: Final[str] = "meta"
DATA_DIR: Final[str] = "data"
VIDEOS_DIR: Final[str] = "videos"
INFO_PATH: Final[str] = META_DIR + "/info.json"
STATS_PATH: Final[str] = META_DIR + "/stats.json"
TASKS_PATH: Final[str] = META_DIR + "/tasks.parquet"
EPISODES_DIR: Final[str] = META_DIR + "/episodes"
DATA_PATH: Final[str] = DATA_DIR + "/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet"
VIDEO_PATH: Final[str] = VIDEOS_DIR + "/{video_key}/chunk-{chunk_index:03d}/file-{file_index:03d}.mp4"
EPISODES_PATH: Final[str] = EPISODES_DIR + "/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet"
CHUNK_FILE_RE: Final[re.Pattern[str]] = re.compile(r"chunk-(\d+)/file-(\d+)\.(parquet|mp4)$")

# tasks.parquet as LeRobot writes it through pandas: the task string is the unnamed index.
TASK_INDEX_COLUMN: Final[str] = "__index_level_0__"
# Per-episode stats are episodes-parquet columns "stats/<feature>/<stat>".
STATS_PREFIX: Final[str] = "stats/"


@dataclass(frozen=True, order=True)
class FileRef:
    """A (chunk, file) pair. ``next`` moves to a new chunk after ``chunks_size`` files."""

    chunk: int = 0
    file: int = 0

    def next(self, chunks_size: int) -> FileRef:
        if self.file >= chunks_size - 1:
            return FileRef(self.chunk + 1, 0)
        return FileRef(self.chunk, self.file + 1)


def data_path(root: Path, ref: FileRef) -> Path:
    return root / DATA_PATH.format(chunk_index=ref.chunk, file_index=ref.file)


def video_path(root: Path, key: str, ref: FileRef) -> Path:
    return root / VIDEO_PATH.format(video_key=key, chunk_index=ref.chunk, file_index=ref.file)


def episodes_path(root: Path, ref: FileRef) -> Path:
    return root / EPISODES_PATH.format(chunk_index=ref.chunk, file_index=ref.file)


def data_ref(row: Mapping[str, Any]) -> FileRef:
    """The data file of an episodes-parquet row."""
    return FileRef(row["data/chunk_index"], row["data/file_index"])


def video_ref(row: Mapping[str, Any], key: str) -> FileRef:
    """The file of video ``key`` of an episodes-parquet row."""
    return FileRef(row[f"videos/{key}/chunk_index"], row[f"videos/{key}/file_index"])


def episodes_ref(row: Mapping[str, Any]) -> FileRef:
    """The episodes-parquet file an episodes-parquet row sits in."""
    return FileRef(row["meta/episodes/chunk_index"], row["meta/episodes/file_index"])


def data_file_path(root: PathLike, info: Mapping[str, Any], row: Mapping[str, Any]) -> Path:
    """The data file of an episode, by the dataset's own ``data_path`` template."""
    ref = data_ref(row)
    return Path(root) / info["data_path"].format(chunk_index=ref.chunk, file_index=ref.file)


def video_file_path(root: PathLike, info: Mapping[str, Any], row: Mapping[str, Any], key: str) -> Path:
    """The video file of feature ``key`` of an episode, by the dataset's own ``video_path``."""
    template = info.get("video_path")
    if not template:
        raise CorruptDatasetError(str(Path(root) / INFO_PATH), "has video features but no video_path")
    ref = video_ref(row, key)
    return Path(root) / template.format(video_key=key, chunk_index=ref.chunk, file_index=ref.file)


def episodes_files(root: PathLike) -> list[Path]:
    return _chunk_files(Path(root) / EPISODES_DIR, "parquet")


def data_files(root: PathLike) -> list[Path]:
    return _chunk_files(Path(root) / DATA_DIR, "parquet")


def _chunk_files(directory: Path, ext: str) -> list[Path]:
    # LeRobot globs "*/*.parquet" and sorts by path; zero-padded names make that numeric order.
    return sorted(p for p in directory.glob(f"*/*.{ext}") if p.is_file())


def chunk_file_index(path: PathLike) -> tuple[int, int] | None:
    """(chunk_index, file_index) of a ``chunk-XXX/file-XXX.ext`` path, None for other names."""
    match = CHUNK_FILE_RE.search(Path(path).as_posix())
    return (int(match.group(1)), int(match.group(2))) if match else None
