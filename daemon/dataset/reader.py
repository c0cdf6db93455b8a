"""Read a LeRobot v3.0 dataset with pyarrow and PyAV only (no LeRobot, no pandas, no torch).

What this module reads is what LeRobot 0.4.x writes and what the native writer writes:

- ``meta/info.json``, ``meta/stats.json``;
- ``meta/tasks.parquet``: ``task_index`` plus the task string, either as a ``task`` column or as
  the pandas index column (LeRobot 0.4.4 writes an unnamed index, stored as
  ``__index_level_0__``);
- ``meta/episodes/chunk-XXX/file-XXX.parquet``: one row per episode, ``stats/*`` columns included;
- ``data/chunk-XXX/file-XXX.parquet``: one row per frame;
- ``videos/<key>/chunk-XXX/file-XXX.mp4``: one or more episodes per file, each episode at
  ``[from_timestamp, to_timestamp)`` of its file.

Every file that cannot be read raises :class:`CorruptDatasetError` naming the file, so a caller can
tell "this dataset is broken here" from "this code is broken".
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any, Final

import av
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from hilrec.daemon.dataset.stats import DatasetStats, stats_from_json, unflatten_episode_stats
from hilrec.daemon.errors import CorruptDatasetError, DatasetError

INFO_PATH: Final[str] = "meta/info.json"
STATS_PATH: Final[str] = "meta/stats.json"
TASKS_PATH: Final[str] = "meta/tasks.parquet"
EPISODES_DIR: Final[str] = "meta/episodes"
DATA_DIR: Final[str] = "data"
VIDEOS_DIR: Final[str] = "videos"
CHUNK_FILE_RE: Final[re.Pattern[str]] = re.compile(r"chunk-(\d+)/file-(\d+)\.(parquet|mp4)$")
STATS_PREFIX: Final[str] = "stats/"

PathLike = str | os.PathLike[str]


# --- metadata ------------------------------------------------------------------------------------


def load_info(root: PathLike) -> dict[str, Any]:
    """``meta/info.json`` as a dict (shapes stay lists, as on disk)."""
    info = _load_json(Path(root) / INFO_PATH)
    if not isinstance(info, dict) or not isinstance(info.get("features"), dict):
        raise CorruptDatasetError(str(Path(root) / INFO_PATH), "has no 'features' mapping")
    return info


def load_stats(root: PathLike) -> DatasetStats | None:
    """``meta/stats.json`` as ``{key: {stat: ndarray}}``; None when the file does not exist."""
    path = Path(root) / STATS_PATH
    if not path.exists():
        return None
    data = _load_json(path)
    if not isinstance(data, dict) or not all(isinstance(v, dict) for v in data.values()):
        raise CorruptDatasetError(str(path), "is not a mapping of feature -> {stat: values}")
    return stats_from_json(data)


def load_tasks(root: PathLike) -> dict[int, str]:
    """``{task_index: task}`` from ``meta/tasks.parquet``, ordered by task_index."""
    path = Path(root) / TASKS_PATH
    table = read_parquet(path)
    return tasks_from_table(table, path)


def tasks_from_table(table: pa.Table, path: PathLike) -> dict[int, str]:
    names = table.column_names
    if "task_index" not in names:
        raise CorruptDatasetError(str(path), "has no 'task_index' column")
    task_column = "task" if "task" in names else _pandas_index_column(table)
    if task_column is None:
        raise CorruptDatasetError(str(path), "has neither a 'task' column nor a pandas index column")
    indices = table.column("task_index").to_pylist()
    tasks = table.column(task_column).to_pylist()
    if any(i is None for i in indices) or any(not isinstance(t, str) for t in tasks):
        raise CorruptDatasetError(str(path), "has null task indices or non-string tasks")
    return dict(sorted(zip((int(i) for i in indices), tasks)))


def _pandas_index_column(table: pa.Table) -> str | None:
    meta = table.schema.metadata or {}
    raw = meta.get(b"pandas")
    if raw is None:
        return None
    try:
        index_columns = json.loads(raw).get("index_columns", [])
    except ValueError:
        return None
    for column in index_columns:
        if isinstance(column, str) and column in table.column_names:
            return column
    return None


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


def load_episodes(root: PathLike, with_stats: bool = False) -> list[dict[str, Any]]:
    """Rows of ``meta/episodes/*/*.parquet``, sorted by episode_index.

    Without ``with_stats`` the ``stats/*`` columns are left out (as LeRobot's ``load_episodes``
    does). With it, each row also gets ``"stats": {key: {stat: ndarray}}``.
    """
    files = episodes_files(root)
    if not files:
        raise CorruptDatasetError(str(Path(root) / EPISODES_DIR), "holds no episodes parquet file")
    rows: list[dict[str, Any]] = []
    for path in files:
        schema = read_parquet_schema(path)
        wanted = None if with_stats else [n for n in schema.names if not n.startswith(STATS_PREFIX)]
        for row in read_parquet(path, columns=wanted).to_pylist():
            if with_stats:
                row["stats"] = unflatten_episode_stats(row)
                row = {k: v for k, v in row.items() if not k.startswith(STATS_PREFIX)}
            rows.append(row)
    if any(not isinstance(r.get("episode_index"), int) for r in rows):
        raise CorruptDatasetError(str(Path(root) / EPISODES_DIR), "has rows without an episode_index")
    return sorted(rows, key=lambda r: r["episode_index"])


def episode_row(root: PathLike, episode_index: int) -> dict[str, Any]:
    for row in load_episodes(root):
        if row["episode_index"] == episode_index:
            return row
    raise DatasetError(f"{root}: no episode {episode_index} in {EPISODES_DIR}")


# --- parquet -------------------------------------------------------------------------------------


def read_parquet_schema(path: PathLike) -> pa.Schema:
    try:
        return pq.read_schema(path)
    except (OSError, pa.ArrowException) as exc:
        raise CorruptDatasetError(str(path), f"unreadable parquet: {exc}") from exc


def read_parquet(path: PathLike, columns: Sequence[str] | None = None) -> pa.Table:
    """A whole parquet file, or some of its columns."""
    if not Path(path).exists():
        raise CorruptDatasetError(str(path), "missing")
    # One file through ParquetFile, not pq.read_table: that goes through pyarrow.dataset, whose
    # import pulls in pandas (half a second before the first replay or check).
    try:
        with pq.ParquetFile(path) as parquet:
            return parquet.read(columns=list(columns) if columns is not None else None)
    except (OSError, pa.ArrowException) as exc:
        raise CorruptDatasetError(str(path), f"unreadable parquet: {exc}") from exc


def read_episode_rows(path: PathLike, episode_index: int, columns: Sequence[str]) -> pa.Table:
    """The rows of one episode from a data file, reading only the row groups that can hold it.

    Row-group statistics of ``episode_index`` skip the other episodes' groups (the native writer
    and LeRobot both write at least one row group per episode). ``pyarrow.dataset`` would do the
    same but imports pandas.
    """
    if not Path(path).exists():
        raise CorruptDatasetError(str(path), "missing")
    wanted = list(dict.fromkeys([*columns, "episode_index"]))
    try:
        parquet = pq.ParquetFile(path)
        position = parquet.schema_arrow.get_field_index("episode_index")
        if position < 0:
            raise CorruptDatasetError(str(path), "has no episode_index column")
        groups = []
        for i in range(parquet.metadata.num_row_groups):
            stats = parquet.metadata.row_group(i).column(position).statistics
            if stats is not None and stats.has_min_max and not (stats.min <= episode_index <= stats.max):
                continue
            groups.append(i)
        table = (
            parquet.read_row_groups(groups, columns=wanted)
            if groups
            else parquet.schema_arrow.empty_table().select(wanted)
        )
    except (OSError, pa.ArrowException) as exc:
        raise CorruptDatasetError(str(path), f"unreadable parquet: {exc}") from exc
    return table.filter(pc.equal(table.column("episode_index"), episode_index))


def column_to_numpy(
    column: pa.ChunkedArray | pa.Array,
    shape: Sequence[int],
    *,
    name: str = "<column>",
    path: PathLike = "<table>",
) -> np.ndarray:
    """Arrow column -> ``(n,)`` for shape ``[1]`` or ``(n, *shape)``, in the stored dtype.

    Vectors may be stored as fixed-size lists (LeRobot's ``Sequence(length=d)``) or plain lists;
    either way every row must hold exactly the declared number of values.
    """
    array = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    if array.null_count:
        raise CorruptDatasetError(str(path), f"column '{name}' has {array.null_count} null rows")
    shape = tuple(int(d) for d in shape)
    n = len(array)
    if shape == (1,) and not _is_list(array.type):
        return array.to_numpy(zero_copy_only=False)
    for depth, size in enumerate(shape):
        if not _is_list(array.type):
            raise CorruptDatasetError(
                str(path),
                f"column '{name}' is {column.type}, not nested {len(shape)} deep for shape {list(shape)}",
            )
        lengths = pc.list_value_length(array)
        if pc.any(pc.not_equal(lengths, size)).as_py():
            bad = pc.index(pc.not_equal(lengths, size), True).as_py()
            raise CorruptDatasetError(
                str(path),
                f"column '{name}': a row holds "
                f"{lengths[bad].as_py()} values at depth {depth}, "
                f"declared shape {list(shape)}",
            )
        array = array.flatten()
        if array.null_count:
            raise CorruptDatasetError(str(path), f"column '{name}' has null values")
    if _is_list(array.type):
        raise CorruptDatasetError(str(path), f"column '{name}' is nested deeper than shape {list(shape)}")
    return array.to_numpy(zero_copy_only=False).reshape((n, *shape))


def _is_list(arrow_type: pa.DataType) -> bool:
    return (
        pa.types.is_list(arrow_type)
        or pa.types.is_large_list(arrow_type)
        or pa.types.is_fixed_size_list(arrow_type)
    )


def read_episode(
    root: PathLike, episode_index: int, columns: Iterable[str] | None = None
) -> dict[str, np.ndarray]:
    """The parquet columns of one episode: vectors ``(n, d)``, scalars ``(n,)``, stored dtype.

    ``columns`` defaults to every non-video, non-image feature of ``info.json``.
    """
    root = Path(root)
    info = load_info(root)
    features = info["features"]
    wanted = (
        list(columns)
        if columns is not None
        else [k for k, ft in features.items() if ft.get("dtype") not in ("video", "image")]
    )
    for key in wanted:
        if key not in features or features[key].get("dtype") in ("video", "image"):
            raise DatasetError(f"{root}: '{key}' is not a numeric feature of this dataset")
    row = episode_row(root, episode_index)
    path = root / info["data_path"].format(
        chunk_index=row["data/chunk_index"], file_index=row["data/file_index"]
    )
    table = read_episode_rows(path, episode_index, wanted)
    if table.num_rows != row["length"]:
        raise CorruptDatasetError(
            str(path), f"episode {episode_index} has {table.num_rows} rows, its metadata says {row['length']}"
        )
    return {
        key: column_to_numpy(table.column(key), features[key]["shape"], name=key, path=path) for key in wanted
    }


# --- video ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class VideoStreamInfo:
    """What a video file's first video stream says about itself, without decoding a frame."""

    path: Path
    codec: str
    pix_fmt: str | None
    width: int
    height: int
    fps: Fraction | None  # the stream's average frame rate
    frame_timestamps: np.ndarray  # seconds, float64, sorted: one per packet that carries a frame

    @property
    def num_frames(self) -> int:
        return len(self.frame_timestamps)


def probe_video(path: PathLike) -> VideoStreamInfo:
    """Stream parameters and every frame's presentation time (demuxed, not decoded)."""
    path = Path(path)
    if not path.exists():
        raise CorruptDatasetError(str(path), "missing")
    try:
        with av.open(str(path)) as container:
            if not container.streams.video:
                raise CorruptDatasetError(str(path), "has no video stream")
            stream = container.streams.video[0]
            time_base = stream.time_base
            pts = [
                packet.pts for packet in container.demux(stream) if packet.pts is not None and packet.size > 0
            ]
            rate = stream.average_rate
            return VideoStreamInfo(
                path=path,
                codec=stream.codec.canonical_name,
                pix_fmt=stream.pix_fmt,
                width=stream.width,
                height=stream.height,
                fps=Fraction(rate) if rate else None,
                frame_timestamps=np.sort(np.asarray(pts, dtype=np.float64) * float(time_base)),
            )
    except av.FFmpegError as exc:
        raise CorruptDatasetError(str(path), f"unreadable video: {exc}") from exc


def decoded_frames(path: PathLike) -> Iterator[tuple[float, av.VideoFrame]]:
    """Every presented frame of a file's first video stream with its timestamp in seconds.

    Raises ``av.FFmpegError`` for the caller to name the file in its own terms."""
    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        stream.thread_type = "AUTO"
        for frame in container.decode(stream):
            if frame.pts is not None:
                yield float(frame.pts * stream.time_base), frame


def decode_video(
    path: PathLike, timestamps: Sequence[float] | np.ndarray, *, tolerance_s: float = 1e-4
) -> np.ndarray:
    """Decode the frames presented at ``timestamps`` (seconds): ``(k, H, W, 3)`` uint8 RGB.

    Like LeRobot's decoder, a timestamp takes the nearest frame and must be within
    ``tolerance_s`` of it; unlike it, the whole span is decoded from the start of the file, so no
    seek precision is assumed.
    """
    path = Path(path)
    wanted = np.asarray(timestamps, dtype=np.float64)
    if wanted.size == 0:
        return np.empty((0, 0, 0, 3), dtype=np.uint8)
    last = float(wanted.max()) + tolerance_s
    found_ts: list[float] = []
    found: list[np.ndarray] = []
    try:
        for ts, frame in decoded_frames(path):
            if ts > last:
                break
            if np.abs(wanted - ts).min() <= tolerance_s:
                found_ts.append(ts)
                found.append(frame.to_ndarray(format="rgb24"))
    except av.FFmpegError as exc:
        raise CorruptDatasetError(str(path), f"unreadable video: {exc}") from exc
    if not found:
        raise CorruptDatasetError(
            str(path), f"no frame within {tolerance_s} s of the {len(wanted)} requested timestamps"
        )
    have = np.asarray(found_ts)
    picks = [int(np.abs(have - t).argmin()) for t in wanted]
    misses = [float(t) for t, p in zip(wanted, picks) if abs(have[p] - t) > tolerance_s]
    if misses:
        raise CorruptDatasetError(
            str(path), f"no frame within {tolerance_s} s of timestamps {misses[:5]} ({len(misses)} in all)"
        )
    return np.stack([found[p] for p in picks])


def read_episode_frames(
    root: PathLike, episode_index: int, key: str, frame_indices: Sequence[int] | None = None
) -> np.ndarray:
    """Decoded frames of one video feature of one episode: ``(n, H, W, 3)`` uint8.

    Frame ``i`` is the one presented at ``from_timestamp + i / fps`` of the episode's file, the
    same timestamps LeRobot queries.
    """
    root = Path(root)
    info = load_info(root)
    if info["features"].get(key, {}).get("dtype") != "video":
        raise DatasetError(f"{root}: '{key}' is not a video feature")
    row = episode_row(root, episode_index)
    path = video_file_path(root, info, row, key)
    indices = np.arange(row["length"]) if frame_indices is None else np.asarray(frame_indices)
    start = float(row[f"videos/{key}/from_timestamp"])
    return decode_video(path, start + indices / float(info["fps"]))


def video_file_path(root: PathLike, info: dict[str, Any], row: dict[str, Any], key: str) -> Path:
    template = info.get("video_path")
    if not template:
        raise CorruptDatasetError(str(Path(root) / INFO_PATH), "has video features but no video_path")
    return Path(root) / template.format(
        video_key=key,
        chunk_index=row[f"videos/{key}/chunk_index"],
        file_index=row[f"videos/{key}/file_index"],
    )


def episode_stats(row: dict[str, Any]) -> DatasetStats:
    """Per-episode stats of a :func:`load_episodes` row (either form)."""
    return row["stats"] if "stats" in row else unflatten_episode_stats(row)


# --- helpers -------------------------------------------------------------------------------------


def _load_json(path: Path) -> Any:
    if not path.exists():
        raise CorruptDatasetError(str(path), "missing")
    try:
        return json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise CorruptDatasetError(str(path), f"unreadable JSON: {exc}") from exc
