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

Where each file is and what its columns are called is :mod:`.paths`'s, shared with the writer;
a video's stream is read by :func:`.video.probe_video`, which this module passes on.

Every file that cannot be read raises :class:`CorruptDatasetError` naming the file, so a caller can
tell "this dataset is broken here" from "this code is broken".
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import av
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from hilrec.daemon.atomic import read_json
from hilrec.daemon.dataset.format.paths import (
    EPISODES_DIR,
    INFO_PATH,
    STATS_PATH,
    STATS_PREFIX,
    TASK_INDEX_COLUMN,
    TASKS_PATH,
    PathLike,
    data_file_path,
    episodes_files,
    video_file_path,
)
from hilrec.daemon.dataset.format.stats import DatasetStats, stats_from_json, unflatten_episode_stats
from hilrec.daemon.dataset.video.avlog import open_av
from hilrec.daemon.dataset.video.codec import VideoProbe, probe_video, stream_time_base
from hilrec.daemon.errors import CorruptDatasetError, DatasetError

# A dataset's videos are read through this module too: the probe and the file of an episode are
# video's and paths' own, named here so that a reader of datasets needs one import.
__all__ = [
    "VideoProbe",
    "column_to_numpy",
    "decode_video",
    "decoded_frames",
    "episode_row",
    "episode_stats",
    "load_episodes",
    "load_info",
    "load_stats",
    "load_task_list",
    "load_tasks",
    "probe_video",
    "read_episode",
    "read_episode_frames",
    "read_episode_rows",
    "read_parquet",
    "read_parquet_schema",
    "tasks_from_table",
    "video_file_path",
]

# --- metadata ------------------------------------------------------------------------------------


def load_info(root: PathLike) -> dict[str, Any]:
    """``meta/info.json`` as a dict (shapes stay lists, as on disk)."""
    path = Path(root) / INFO_PATH
    info = read_json(path, if_missing="missing: not a LeRobot dataset root")
    if not isinstance(info, dict) or not isinstance(info.get("features"), dict):
        raise CorruptDatasetError(str(path), "has no 'features' mapping")
    return info


def load_stats(root: PathLike) -> DatasetStats | None:
    """``meta/stats.json`` as ``{key: {stat: ndarray}}``; None when the file does not exist."""
    path = Path(root) / STATS_PATH
    data = read_json(path, if_missing=None)
    if data is None:
        return None
    if not isinstance(data, dict) or not all(isinstance(v, dict) for v in data.values()):
        raise CorruptDatasetError(str(path), "is not a mapping of feature -> {stat: values}")
    return stats_from_json(data)


def load_tasks(root: PathLike) -> dict[int, str]:
    """``{task_index: task}`` from ``meta/tasks.parquet``, ordered by task_index."""
    path = Path(root) / TASKS_PATH
    return tasks_from_table(read_parquet(path), path)


def load_task_list(root: PathLike) -> list[str]:
    """The task strings by task_index, which must run 0..n-1; [] before the first episode."""
    path = Path(root) / TASKS_PATH
    if not path.exists():
        return []
    table = read_parquet(path)
    tasks = tasks_from_table(table, path)
    if list(tasks) != list(range(table.num_rows)):
        raise CorruptDatasetError(str(path), "task_index is not 0..n-1")
    return list(tasks.values())


def tasks_from_table(table: pa.Table, path: PathLike) -> dict[int, str]:
    """Tasks from a ``task`` column or, as LeRobot writes it through pandas, the index column."""
    names = table.column_names
    if "task_index" not in names:
        raise CorruptDatasetError(str(path), "has no 'task_index' column")
    task_column = "task" if "task" in names else _pandas_index_column(table)
    if task_column is None and TASK_INDEX_COLUMN in names:
        task_column = TASK_INDEX_COLUMN  # the pandas metadata was lost, its column was not
    if task_column is None:
        raise CorruptDatasetError(str(path), "has neither a 'task' column nor a pandas index column")
    indices = table.column("task_index").to_pylist()
    tasks = table.column(task_column).to_pylist()
    if any(i is None for i in indices) or any(not isinstance(t, str) for t in tasks):
        raise CorruptDatasetError(str(path), "has null task indices or non-string tasks")
    return dict(sorted(zip((int(i) for i in indices), tasks, strict=True)))


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
            rows.append({k: v for k, v in row.items() if not k.startswith(STATS_PREFIX)})
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
    shape: Sequence[int] | None = None,
    *,
    name: str = "<column>",
    path: PathLike = "<table>",
) -> np.ndarray:
    """Arrow column -> ``(n,)`` for shape ``[1]`` or ``(n, *shape)``, in the stored dtype.

    Vectors may be stored as fixed-size lists (LeRobot's ``Sequence(length=d)``) or plain lists;
    either way every row must hold exactly the declared number of values. Without ``shape`` it is
    the column's own: the sizes of its fixed-size lists, ``[1]`` for a plain column (the native
    writer's data files, whose schema is the declared one).
    """
    array = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    if array.null_count:
        raise CorruptDatasetError(str(path), f"column '{name}' has {array.null_count} null rows")
    shape = tuple(int(d) for d in shape) if shape is not None else _stored_shape(array.type)
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


def _stored_shape(arrow_type: pa.DataType) -> tuple[int, ...]:
    sizes: list[int] = []
    while pa.types.is_fixed_size_list(arrow_type):
        sizes.append(arrow_type.list_size)
        arrow_type = arrow_type.value_type
    return tuple(sizes) or (1,)


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
    path = data_file_path(root, info, row)
    table = read_episode_rows(path, episode_index, wanted)
    if table.num_rows != row["length"]:
        raise CorruptDatasetError(
            str(path), f"episode {episode_index} has {table.num_rows} rows, its metadata says {row['length']}"
        )
    return {
        key: column_to_numpy(table.column(key), features[key]["shape"], name=key, path=path) for key in wanted
    }


# --- video ---------------------------------------------------------------------------------------


def decoded_frames(path: PathLike) -> Iterator[tuple[float, av.VideoFrame]]:
    """Every presented frame of a file's first video stream with its timestamp in seconds.

    Raises ``av.FFmpegError`` for the caller to name the file in its own terms."""
    with open_av(str(path)) as container:
        stream = container.streams.video[0]
        stream.thread_type = "AUTO"
        time_base = stream_time_base(stream, Path(path))
        for frame in container.decode(stream):
            if frame.pts is not None:
                yield float(frame.pts * time_base), frame


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
    misses = [float(t) for t, p in zip(wanted, picks, strict=True) if abs(have[p] - t) > tolerance_s]
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


def episode_stats(row: dict[str, Any]) -> DatasetStats:
    """Per-episode stats of a :func:`load_episodes` row (either form)."""
    return row["stats"] if "stats" in row else unflatten_episode_stats(row)
