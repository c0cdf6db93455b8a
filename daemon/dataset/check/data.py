"""Checker rules met while loading: info.json, tasks.parquet, episode metadata, data schema.

:func:`load_contents` reads what it can, reporting ``file.unreadable``, ``info.fields``,
``schema.*``, ``tasks.table`` and the metadata half of ``episodes.range`` and
``episode_index.contiguous`` on the way, and returns the rows split per episode (one contiguous
block each) for :mod:`.checks_rows`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Final

import numpy as np
import pyarrow as pa

from hilrec.daemon.dataset.check.common import Contents, EpisodeRows, Findings
from hilrec.daemon.dataset.format.features import DEFAULT_FEATURES
from hilrec.daemon.dataset.format.paths import (
    CODEBASE_VERSION,
    DATA_DIR,
    EPISODES_DIR,
    INFO_PATH,
    STATS_PREFIX,
    TASKS_PATH,
    chunk_file_index,
    data_files,
    episodes_files,
)
from hilrec.daemon.dataset.format.reader import (
    column_to_numpy,
    load_info,
    read_parquet,
    read_parquet_schema,
    tasks_from_table,
)
from hilrec.daemon.dataset.format.stats import unflatten_episode_stats
from hilrec.daemon.errors import CorruptDatasetError

EPISODE_COLUMNS: Final[tuple[str, ...]] = (
    "episode_index",
    "tasks",
    "length",
    "data/chunk_index",
    "data/file_index",
    "dataset_from_index",
    "dataset_to_index",
)


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
    contents = Contents(
        root=root,
        info=info,
        features=features,
        fps=int(info["fps"]),
        tasks=_load_tasks(root, findings),
        tasks_file=root / TASKS_PATH,
    )
    _load_episodes(contents, findings)
    _load_rows(contents, findings)
    return contents


def _check_info(info: dict[str, Any], findings: Findings, path: Path) -> dict[str, Any] | None:
    """info.fields; returns the well-formed features, or None when the rest cannot be checked."""

    def fail(message: str, key: str | None = None) -> None:
        findings.add("info.fields", path, message, key=key)

    if info.get("codebase_version") != CODEBASE_VERSION:
        fail(
            f"codebase_version is {info.get('codebase_version')!r}, expected {CODEBASE_VERSION!r}",
            "codebase_version",
        )
    fps = info.get("fps")
    usable = True
    if isinstance(fps, bool) or not isinstance(fps, int) or fps <= 0:
        fail(f"fps must be a positive integer, got {fps!r}", "fps")
        usable = False
    data_path = info.get("data_path")
    if not isinstance(data_path, str) or "{chunk_index" not in data_path or "{file_index" not in data_path:
        fail(f"data_path must be a template with chunk_index and file_index, got {data_path!r}", "data_path")
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
            fail(
                f"must be {default['dtype']} {default['shape']}, declared "
                f"{spec.get('dtype')} {spec.get('shape')}",
                key,
            )
            usable = False
    has_video = any(ft.get("dtype") == "video" for ft in features.values())
    video_path = info.get("video_path")
    if has_video and (not isinstance(video_path, str) or "{video_key" not in video_path):
        fail(f"video features need a video_path template with video_key, got {video_path!r}", "video_path")
    return features if usable else None


# Per-frame text features: "string" (LeRobot 0.4.4 and later) and "language", LeRobot 0.6's
# subtask annotations (a list of {role, ...} structs per frame). Neither has numeric stats.
TEXT_DTYPES = frozenset({"string", "language"})


def _spec_problem(key: str, spec: Any) -> str | None:
    if "/" in key:
        return "feature names must not contain '/'"
    if not isinstance(spec, dict):
        return f"spec must be a mapping, got {type(spec).__name__}"
    dtype, shape = spec.get("dtype"), spec.get("shape")
    if (
        not isinstance(shape, list)
        or not shape
        or not all(isinstance(d, int) and not isinstance(d, bool) and d > 0 for d in shape)
    ):
        return f"shape must be a non-empty list of positive ints, got {shape!r}"
    if dtype in ("video", "image"):
        if len(shape) != 3:
            return f"{dtype} shape must be [height, width, channels], got {shape}"
        return None
    if dtype in TEXT_DTYPES:
        return None if shape == [1] else f"a {dtype} feature has shape [1], got {shape}"
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
        findings.add(
            "tasks.table", path, f"{table.num_rows} rows but {len(indices)} distinct task_index values"
        )
    if indices != list(range(len(indices))):
        findings.add(
            "tasks.table", path, f"task_index values are {indices[:10]}, expected 0 .. {len(indices) - 1}"
        )
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
        findings.add(
            "file.unreadable",
            contents.root / EPISODES_DIR,
            f"no {EPISODES_DIR}/chunk-XXX/file-XXX.parquet file",
        )
        return
    for path in files:
        try:
            rows = read_parquet(path).to_pylist()
        except CorruptDatasetError as exc:
            findings.add("file.unreadable", path, exc.problem)
            continue
        ref = chunk_file_index(path.relative_to(contents.root / EPISODES_DIR))
        for row in rows:
            episode = row.get("episode_index")
            missing = [c for c in EPISODE_COLUMNS if row.get(c) is None]
            if not isinstance(episode, int):
                findings.add("episodes.range", path, "a row has no episode_index")
                continue
            if missing:
                findings.add("episodes.range", path, f"columns {missing} missing or null", episode=episode)
                continue
            if episode in contents.episodes:
                findings.add(
                    "episode_index.contiguous",
                    path,
                    f"episode {episode} has more than one metadata row",
                    episode=episode,
                )
                continue
            meta_ref = (row.get("meta/episodes/chunk_index"), row.get("meta/episodes/file_index"))
            if ref is not None and meta_ref != ref:
                findings.add(
                    "episodes.range",
                    path,
                    f"meta/episodes chunk/file index say {meta_ref}, but the row is in chunk/file {ref}",
                    episode=episode,
                )
            row["stats"] = unflatten_episode_stats(row)
            contents.episodes[episode] = {k: v for k, v in row.items() if not k.startswith(STATS_PREFIX)}
            contents.episode_files[episode] = path
    indices = sorted(contents.episodes)
    if indices != list(range(len(indices))):
        gaps = sorted(set(range(max(indices, default=-1) + 1)) - set(indices))
        findings.add(
            "episode_index.contiguous",
            files[0],
            f"episode indices are not 0 .. {len(indices) - 1}: missing {gaps[:10]}",
        )


def _load_rows(contents: Contents, findings: Findings) -> None:
    """Read every data file; split rows per episode (one contiguous block each)."""
    contents.data_files = data_files(contents.root)
    if not contents.data_files and contents.episodes:
        findings.add("file.unreadable", contents.root / DATA_DIR, f"no {DATA_DIR}/chunk-XXX/file-XXX.parquet")
    table_keys = [k for k, ft in contents.features.items() if ft.get("dtype") != "video"]
    blocks: list[tuple[Path, int, int, int, dict[str, np.ndarray]]] = []
    global_index: list[np.ndarray] = []
    index_complete = True
    for path in contents.data_files:
        columns = _read_data_file(path, contents, table_keys, findings)
        if columns is None or "episode_index" not in columns:
            continue
        episodes = columns["episode_index"]
        contents.file_rows.append((path, len(episodes)))
        if "index" in columns:
            global_index.append(columns["index"])
        else:
            index_complete = False  # schema.* already reports the column; no second failure
        change = np.ones(len(episodes), dtype=bool)
        change[1:] = episodes[1:] != episodes[:-1]
        starts = np.flatnonzero(change)
        ends = [*starts[1:], len(episodes)]
        for first, stop in zip(starts, ends, strict=True):
            blocks.append((path, int(first), int(stop), int(episodes[first]), columns))
    contents.global_index = (
        np.concatenate(global_index) if global_index and index_complete else np.array([], np.int64)
    )
    seen: dict[int, tuple[Path, int]] = {}
    previous = -1
    for path, start, end, episode, columns in blocks:
        if episode in seen:
            first_path, first_start = seen[episode]
            findings.add(
                "episode_index.contiguous",
                path,
                f"rows of episode {episode} are split: a block at row {first_start} of "
                f"{findings.rel(first_path)} and another at row {start} of this file",
                episode=episode,
            )
            contents.rows.pop(episode, None)
            continue
        if episode < previous:
            findings.add(
                "episode_index.contiguous",
                path,
                f"episode {episode} starts at row {start}, after episode {previous}",
                episode=episode,
            )
        previous = max(previous, episode)
        seen[episode] = (path, start)
        contents.rows[episode] = EpisodeRows(
            file=path, first_row=start, columns={k: v[start:end] for k, v in columns.items()}
        )


def _read_data_file(
    path: Path, contents: Contents, keys: list[str], findings: Findings
) -> dict[str, np.ndarray] | None:
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
            findings.add(
                "schema.columns", path, "column not declared in info.json (or is a video feature)", key=name
            )
    readable = [
        k
        for k in keys
        if k in names and _type_ok(path, k, schema.field(k).type, contents.features[k], findings)
    ]
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
        if spec["dtype"] in TEXT_DTYPES:
            continue  # no numeric checks or stats apply to text
        try:
            columns[key] = column_to_numpy(table.column(key), spec["shape"], name=key, path=path)
        except CorruptDatasetError as exc:
            findings.add("schema.shape", path, exc.problem, key=key)
    return columns


def _type_ok(path: Path, key: str, arrow_type: pa.DataType, spec: dict[str, Any], findings: Findings) -> bool:
    if spec["dtype"] == "string":
        if pa.types.is_string(arrow_type) or pa.types.is_large_string(arrow_type):
            return True
        findings.add("schema.dtype", path, f"string column stored as {arrow_type}", key=key)
        return False
    if spec["dtype"] == "language":
        item = (
            arrow_type.value_type
            if pa.types.is_list(arrow_type) or pa.types.is_large_list(arrow_type)
            else None
        )
        if item is not None and pa.types.is_struct(item) and item.get_field_index("role") >= 0:
            return True
        findings.add(
            "schema.dtype",
            path,
            f"language column stored as {arrow_type}, expected list<struct<role, ...>>",
            key=key,
        )
        return False
    if spec["dtype"] == "image":
        if pa.types.is_struct(arrow_type) and arrow_type.get_field_index("bytes") >= 0:
            return True
        findings.add(
            "schema.dtype",
            path,
            f"image column stored as {arrow_type}, expected struct<bytes, path>",
            key=key,
        )
        return False
    depth, leaf = 0, arrow_type
    while pa.types.is_list(leaf) or pa.types.is_large_list(leaf) or pa.types.is_fixed_size_list(leaf):
        depth += 1
        leaf = leaf.value_type
    shape = spec["shape"]
    want_depth = 0 if shape == [1] else len(shape)
    if depth != want_depth:
        findings.add(
            "schema.shape",
            path,
            f"stored as {arrow_type} ({depth} list levels), shape {shape} needs {want_depth}",
            key=key,
        )
        return False
    try:
        stored = np.dtype(leaf.to_pandas_dtype())
    except (NotImplementedError, TypeError):
        stored = None
    if stored != np.dtype(spec["dtype"]):
        findings.add("schema.dtype", path, f"stored as {leaf}, declared {spec['dtype']}", key=key)
        return False
    return True
