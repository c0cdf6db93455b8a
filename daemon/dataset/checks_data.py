"""Checker rules on metadata and rows: info.json, tasks, episode metadata, data schema and indices.

:func:`load_contents` reads what it can (reporting ``file.unreadable``, ``info.fields``,
``schema.*``, ``tasks.table`` and the metadata half of ``episodes.range`` on the way) and returns
the rows split per episode; :func:`check_rows` then checks indices, timestamps, tasks and ranges.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Final

import numpy as np
import pyarrow as pa

from hilrec.daemon.dataset.checks_common import Contents, EpisodeRows, Findings
from hilrec.daemon.dataset.features import DEFAULT_FEATURES
from hilrec.daemon.dataset.reader import (
    INFO_PATH, TASKS_PATH, chunk_file_index, column_to_numpy, data_files, episodes_files, load_info,
    read_parquet, read_parquet_schema, tasks_from_table,
)
from hilrec.daemon.dataset.stats import unflatten_episode_stats
from hilrec.daemon.errors import CorruptDatasetError

CODEBASE_VERSION: Final[str] = "v3.0"
TIMESTAMP_TOLERANCE_S: Final[float] = 1e-4
EPISODE_COLUMNS: Final[tuple[str, ...]] = (
    "episode_index", "tasks", "length", "data/chunk_index", "data/file_index",
    "dataset_from_index", "dataset_to_index")


# --- loading ---------------------------------------------------------------------------------------


def load_contents(root: Path, findings: Findings) -> Contents | None:
    info_path = root / INFO_PATH
    try:
        info = load_info(root)
    except CorruptDatasetError as exc:
        findings.add("file.unreadable", info_path, exc.problem)
        return None
    features = _check_info(info, findings, info_path)
    if features is None:
        return None
    contents = Contents(root=root, info=info, features=features, fps=int(info["fps"]),
                        tasks=_load_tasks(root, findings), tasks_file=root / TASKS_PATH)
    _load_episodes(contents, findings)
    _load_rows(contents, findings)
    return contents


def _check_info(info: dict[str, Any], findings: Findings, path: Path) -> dict[str, Any] | None:
    """info.fields; returns the well-formed features, or None when the rest cannot be checked."""
    def fail(message: str, key: str | None = None) -> None:
        findings.add("info.fields", path, message, key=key)

    if info.get("codebase_version") != CODEBASE_VERSION:
        fail(f"codebase_version is {info.get('codebase_version')!r}, expected {CODEBASE_VERSION!r}",
             "codebase_version")
    fps = info.get("fps")
    usable = True
    if isinstance(fps, bool) or not isinstance(fps, int) or fps <= 0:
        fail(f"fps must be a positive integer, got {fps!r}", "fps")
        usable = False
    data_path = info.get("data_path")
    if not isinstance(data_path, str) or "{chunk_index" not in data_path \
            or "{file_index" not in data_path:
        fail(f"data_path must be a template with chunk_index and file_index, got {data_path!r}",
             "data_path")
        usable = False
    for name in ("total_episodes", "total_frames", "total_tasks", "chunks_size"):
        value = info.get(name)
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            fail(f"{name} must be a non-negative integer, got {value!r}", name)
    features: dict[str, Any] = {}
    for key, spec in info["features"].items():
        problem = _spec_problem(key, spec)
        if problem:
            fail(problem, key)
        else:
            features[key] = spec
    for key, default in DEFAULT_FEATURES.items():
        spec = info["features"].get(key)
        if spec is None:
            fail("default column missing from features", key)
            usable = False
        elif spec.get("dtype") != default["dtype"] or list(spec.get("shape", [])) != default["shape"]:
            fail(f"must be {default['dtype']} {default['shape']}, declared "
                 f"{spec.get('dtype')} {spec.get('shape')}", key)
            usable = False
    has_video = any(ft.get("dtype") == "video" for ft in features.values())
    video_path = info.get("video_path")
    if has_video and (not isinstance(video_path, str) or "{video_key" not in video_path):
        fail(f"video features need a video_path template with video_key, got {video_path!r}",
             "video_path")
    return features if usable else None


def _spec_problem(key: str, spec: Any) -> str | None:
    if "/" in key:
        return "feature names must not contain '/'"
    if not isinstance(spec, dict):
        return f"spec must be a mapping, got {type(spec).__name__}"
    dtype, shape = spec.get("dtype"), spec.get("shape")
    if not isinstance(shape, list) or not shape or not all(
            isinstance(d, int) and not isinstance(d, bool) and d > 0 for d in shape):
        return f"shape must be a non-empty list of positive ints, got {shape!r}"
    if dtype in ("video", "image"):
        if len(shape) != 3:
            return f"{dtype} shape must be [height, width, channels], got {shape}"
        return None
    try:
        np.dtype(dtype)
    except TypeError:
        return f"dtype {dtype!r} is neither video, image nor a numpy dtype"
    return None


def _load_tasks(root: Path, findings: Findings) -> dict[int, str] | None:
    path = root / TASKS_PATH
    try:
        table = read_parquet(path)
        tasks = tasks_from_table(table, path)
    except CorruptDatasetError as exc:
        findings.add("file.unreadable", path, exc.problem)
        return None
    indices = sorted(tasks)
    if len(indices) != table.num_rows:
        findings.add("tasks.table", path, f"{table.num_rows} rows but {len(indices)} distinct "
                                          f"task_index values")
    if indices != list(range(len(indices))):
        findings.add("tasks.table", path, f"task_index values are {indices[:10]}, expected 0 .. "
                                          f"{len(indices) - 1}")
    strings = list(tasks.values())
    if len(set(strings)) != len(strings):
        dup = next(s for s in strings if strings.count(s) > 1)
        findings.add("tasks.table", path, f"task {dup!r} appears under more than one task_index")
    if any(not s.strip() for s in strings):
        findings.add("tasks.table", path, "holds an empty task string")
    return tasks


def _load_episodes(contents: Contents, findings: Findings) -> None:
    files = episodes_files(contents.root)
    if not files:
        findings.add("file.unreadable", contents.root / "meta/episodes",
                     "no meta/episodes/chunk-XXX/file-XXX.parquet file")
        return
    for path in files:
        try:
            rows = read_parquet(path).to_pylist()
        except CorruptDatasetError as exc:
            findings.add("file.unreadable", path, exc.problem)
            continue
        ref = chunk_file_index(path.relative_to(contents.root / "meta/episodes"))
        for row in rows:
            episode = row.get("episode_index")
            missing = [c for c in EPISODE_COLUMNS if row.get(c) is None]
            if not isinstance(episode, int):
                findings.add("episodes.range", path, "a row has no episode_index")
                continue
            if missing:
                findings.add("episodes.range", path, f"columns {missing} missing or null",
                             episode=episode)
                continue
            if episode in contents.episodes:
                findings.add("episode_index.contiguous", path,
                             f"episode {episode} has more than one metadata row", episode=episode)
                continue
            meta_ref = (row.get("meta/episodes/chunk_index"), row.get("meta/episodes/file_index"))
            if ref is not None and meta_ref != ref:
                findings.add("episodes.range", path, f"meta/episodes chunk/file index say {meta_ref}, "
                                                     f"but the row is in chunk/file {ref}",
                             episode=episode)
            row["stats"] = unflatten_episode_stats(row)
            contents.episodes[episode] = {k: v for k, v in row.items()
                                          if not k.startswith("stats/")}
            contents.episode_files[episode] = path
    indices = sorted(contents.episodes)
    if indices != list(range(len(indices))):
        gaps = sorted(set(range(max(indices, default=-1) + 1)) - set(indices))
        findings.add("episode_index.contiguous", files[0],
                     f"episode indices are not 0 .. {len(indices) - 1}: missing {gaps[:10]}")


def _load_rows(contents: Contents, findings: Findings) -> None:
    """Read every data file; split rows per episode (one contiguous block each)."""
    contents.data_files = data_files(contents.root)
    if not contents.data_files and contents.episodes:
        findings.add("file.unreadable", contents.root / "data", "no data/chunk-XXX/file-XXX.parquet")
    table_keys = [k for k, ft in contents.features.items() if ft.get("dtype") != "video"]
    blocks: list[tuple[Path, int, int, int, dict[str, np.ndarray]]] = []
    global_index: list[np.ndarray] = []
    for path in contents.data_files:
        columns = _read_data_file(path, contents, table_keys, findings)
        if columns is None or "episode_index" not in columns:
            continue
        episodes = columns["episode_index"]
        contents.file_rows.append((path, len(episodes)))
        global_index.append(columns.get("index", np.full(len(episodes), -1, np.int64)))
        change = np.ones(len(episodes), dtype=bool)
        change[1:] = episodes[1:] != episodes[:-1]
        starts = np.flatnonzero(change)
        ends = [*starts[1:], len(episodes)]
        for start, end in zip(starts, ends):
            blocks.append((path, int(start), int(end), int(episodes[start]), columns))
    contents.global_index = (np.concatenate(global_index) if global_index
                             else np.array([], np.int64))
    seen: dict[int, tuple[Path, int]] = {}
    previous = -1
    for path, start, end, episode, columns in blocks:
        if episode in seen:
            first_path, first_start = seen[episode]
            findings.add("episode_index.contiguous", path,
                         f"rows of episode {episode} are split: a block at row {first_start} of "
                         f"{findings.rel(first_path)} and another at row {start} of this file",
                         episode=episode)
            contents.rows.pop(episode, None)
            continue
        if episode < previous:
            findings.add("episode_index.contiguous", path,
                         f"episode {episode} starts at row {start}, after episode {previous}",
                         episode=episode)
        previous = max(previous, episode)
        seen[episode] = (path, start)
        contents.rows[episode] = EpisodeRows(file=path, first_row=start,
                                             columns={k: v[start:end] for k, v in columns.items()})


def _read_data_file(path: Path, contents: Contents, keys: list[str],
                    findings: Findings) -> dict[str, np.ndarray] | None:
    try:
        schema = read_parquet_schema(path)
    except CorruptDatasetError as exc:
        findings.add("file.unreadable", path, exc.problem)
        return None
    names = set(schema.names)
    for key in keys:
        if key not in names:
            findings.add("schema.columns", path, "declared in info.json but not a column", key=key)
    for name in schema.names:
        if name not in keys:
            findings.add("schema.columns", path, "column not declared in info.json (or is a video "
                                                 "feature)", key=name)
    readable = [k for k in keys if k in names
                and _type_ok(path, k, schema.field(k).type, contents.features[k], findings)]
    try:
        table = read_parquet(path, columns=readable)
    except CorruptDatasetError as exc:
        findings.add("file.unreadable", path, exc.problem)
        return None
    columns: dict[str, np.ndarray] = {}
    for key in readable:
        spec = contents.features[key]
        if spec["dtype"] == "image":
            columns[key] = np.asarray(table.column(key).to_pylist(), dtype=object)
            continue
        try:
            columns[key] = column_to_numpy(table.column(key), spec["shape"], name=key, path=path)
        except CorruptDatasetError as exc:
            findings.add("schema.shape", path, exc.problem, key=key)
    return columns


def _type_ok(path: Path, key: str, arrow_type: pa.DataType, spec: dict[str, Any],
             findings: Findings) -> bool:
    if spec["dtype"] == "image":
        if pa.types.is_struct(arrow_type) and arrow_type.get_field_index("bytes") >= 0:
            return True
        findings.add("schema.dtype", path, f"image column stored as {arrow_type}, expected "
                                           f"struct<bytes, path>", key=key)
        return False
    depth, leaf = 0, arrow_type
    while pa.types.is_list(leaf) or pa.types.is_large_list(leaf) or pa.types.is_fixed_size_list(leaf):
        depth += 1
        leaf = leaf.value_type
    shape = spec["shape"]
    want_depth = 0 if shape == [1] else len(shape)
    if depth != want_depth:
        findings.add("schema.shape", path, f"stored as {arrow_type} ({depth} list levels), shape "
                                           f"{shape} needs {want_depth}", key=key)
        return False
    try:
        stored = np.dtype(leaf.to_pandas_dtype())
    except (NotImplementedError, TypeError):
        stored = None
    if stored != np.dtype(spec["dtype"]):
        findings.add("schema.dtype", path, f"stored as {leaf}, declared {spec['dtype']}", key=key)
        return False
    return True


# --- row rules -------------------------------------------------------------------------------------


def check_rows(contents: Contents, findings: Findings) -> None:
    _check_global_index(contents, findings)
    for episode, meta in sorted(contents.episodes.items()):
        if episode not in contents.rows and not findings.has("episode_index.contiguous",
                                                             episode=episode):
            findings.add("episode_index.contiguous", contents.episodes_file(episode),
                         "has a metadata row but no data rows", episode=episode)
    for episode, rows in sorted(contents.rows.items()):
        if episode not in contents.episodes:
            findings.add("episode_index.contiguous", rows.file,
                         f"{rows.length} data rows (from row {rows.first_row}) but no metadata row",
                         episode=episode)
        _check_episode_rows(contents, episode, rows, findings)
    _check_totals(contents, findings)


def _check_global_index(contents: Contents, findings: Findings) -> None:
    index = contents.global_index
    expected = np.arange(len(index))
    if len(index) and not np.array_equal(index, expected):
        at = int(np.flatnonzero(index != expected)[0])
        episode, file, row = _locate(contents, at)
        findings.add("index.contiguous", file,
                     f"row {row} has index {int(index[at])}, expected {at} (index must run "
                     f"0 .. {len(index) - 1} through the files in order)", episode=episode,
                     key="index")


def _locate(contents: Contents, global_row: int) -> tuple[int | None, Path, int]:
    """(episode, file, row in file) of the ``global_row``-th row of the data files."""
    offset = 0
    for path, num_rows in contents.file_rows:
        if offset + num_rows > global_row:
            row = global_row - offset
            for episode, rows in contents.rows.items():
                if rows.file == path and rows.first_row <= row < rows.first_row + rows.length:
                    return episode, path, row
            return None, path, row
        offset += num_rows
    return None, contents.root / "data", global_row


def _check_episode_rows(contents: Contents, episode: int, rows: EpisodeRows,
                        findings: Findings) -> None:
    cols, n, file = rows.columns, rows.length, rows.file

    def first_bad(mask: np.ndarray) -> int:
        return int(np.flatnonzero(mask)[0])

    if "frame_index" in cols and not np.array_equal(cols["frame_index"], np.arange(n)):
        at = first_bad(cols["frame_index"] != np.arange(n))
        findings.add("frame_index.contiguous", file,
                     f"row {rows.first_row + at} has frame_index {int(cols['frame_index'][at])}, "
                     f"expected {at}", episode=episode, key="frame_index")
    if "timestamp" in cols:
        expected = np.arange(n) / contents.fps
        error = np.abs(cols["timestamp"].astype(np.float64) - expected)
        if (error > TIMESTAMP_TOLERANCE_S).any():
            at = first_bad(error > TIMESTAMP_TOLERANCE_S)
            findings.add("timestamp.grid", file,
                         f"row {rows.first_row + at} (frame {at}): timestamp "
                         f"{float(cols['timestamp'][at]):.6f} s is {error[at]:.6f} s off "
                         f"{at}/{contents.fps} s (tolerance {TIMESTAMP_TOLERANCE_S} s; "
                         f"{int((error > TIMESTAMP_TOLERANCE_S).sum())} rows off)",
                         episode=episode, key="timestamp")
    for key, values in cols.items():
        if values.dtype.kind == "f" and not np.isfinite(values).all():
            bad = np.argwhere(~np.isfinite(values.reshape(n, -1)))[0]
            findings.add("data.finite", file, f"row {rows.first_row + int(bad[0])} holds "
                                              f"{values.reshape(n, -1)[tuple(bad)]}",
                         episode=episode, key=key)
    _check_tasks(contents, episode, rows, findings)
    meta = contents.episodes.get(episode)
    if meta is not None:
        _check_range(contents, episode, rows, meta, findings)


def _check_tasks(contents: Contents, episode: int, rows: EpisodeRows, findings: Findings) -> None:
    if "task_index" not in rows.columns or contents.tasks is None:
        return
    used = sorted({int(t) for t in np.unique(rows.columns["task_index"])})
    unknown = [t for t in used if t not in contents.tasks]
    if unknown:
        at = int(np.flatnonzero(np.isin(rows.columns["task_index"], unknown))[0])
        findings.add("tasks.unknown", rows.file,
                     f"row {rows.first_row + at} has task_index {unknown[0]}, not in "
                     f"{findings.rel(contents.tasks_file)} (known: {sorted(contents.tasks)})",
                     episode=episode, key="task_index")
    meta = contents.episodes.get(episode)
    if meta is None or not isinstance(meta.get("tasks"), list):
        return
    row_tasks = sorted(contents.tasks[t] for t in used if t in contents.tasks)
    if sorted(set(meta["tasks"])) != row_tasks or len(set(meta["tasks"])) != len(meta["tasks"]):
        findings.add("tasks.episode", contents.episodes_file(episode),
                     f"metadata lists tasks {meta['tasks']}, its rows use {row_tasks}",
                     episode=episode, key="tasks")


def _check_range(contents: Contents, episode: int, rows: EpisodeRows, meta: dict[str, Any],
                 findings: Findings) -> None:
    file = contents.episodes_file(episode)
    n = rows.length
    if meta["length"] != n:
        findings.add("episodes.range", file, f"length is {meta['length']}, the data has {n} rows",
                     episode=episode, key="length")
    if meta["dataset_to_index"] - meta["dataset_from_index"] != meta["length"]:
        findings.add("episodes.range", file,
                     f"dataset_to_index - dataset_from_index = {meta['dataset_to_index']} - "
                     f"{meta['dataset_from_index']} differs from length {meta['length']}",
                     episode=episode, key="dataset_to_index")
    index = rows.columns.get("index")
    if index is not None and n:
        if int(index[0]) != meta["dataset_from_index"]:
            findings.add("episodes.range", file, f"dataset_from_index is "
                                                 f"{meta['dataset_from_index']}, the first row's "
                                                 f"index is {int(index[0])}",
                         episode=episode, key="dataset_from_index")
        if int(index[-1]) + 1 != meta["dataset_to_index"]:
            findings.add("episodes.range", file, f"dataset_to_index is {meta['dataset_to_index']}, "
                                                 f"the last row's index + 1 is {int(index[-1]) + 1}",
                         episode=episode, key="dataset_to_index")
    expected = contents.root / contents.info["data_path"].format(
        chunk_index=meta["data/chunk_index"], file_index=meta["data/file_index"])
    if expected != rows.file:
        findings.add("episodes.range", file,
                     f"data/chunk_index, data/file_index point to {findings.rel(expected)}, the "
                     f"rows are in {findings.rel(rows.file)}", episode=episode, key="data/file_index")


def _check_totals(contents: Contents, findings: Findings) -> None:
    info, path = contents.info, contents.root / INFO_PATH
    frames = sum(r.length for r in contents.rows.values())
    actual = {"total_episodes": len(contents.episodes), "total_frames": frames}
    if contents.tasks is not None:
        actual["total_tasks"] = len(contents.tasks)
    for name, value in actual.items():
        if info.get(name) != value:
            findings.add("info.totals", path, f"{name} is {info.get(name)}, the files hold {value}",
                         key=name)
    splits = info.get("splits")
    if isinstance(splits, dict) and splits and "train" in splits \
            and splits["train"] != f"0:{len(contents.episodes)}":
        findings.add("info.totals", path, f"splits.train is {splits['train']!r}, expected "
                                          f"'0:{len(contents.episodes)}'", key="splits")
