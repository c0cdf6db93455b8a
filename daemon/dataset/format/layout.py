"""LeRobot v3.0 as the writer lays it down: info.json, and the arrow schemas of its parquet files.

Everything here mirrors what LeRobot 0.4.4 writes (read from its source and from datasets it
wrote), so that ``LeRobotDataset(repo_id, root=...)`` loads our files unchanged. Where each file
goes is :mod:`.paths`'s; reading them back is :mod:`.reader`'s.

- ``data/chunk-XXX/file-XXX.parquet``: one column per non-video feature in features order;
  vectors as ``fixed_size_list<T>[n]``, scalars as plain columns; the Hugging Face ``datasets``
  feature description in the schema metadata (key ``huggingface``).
- ``meta/episodes/chunk-XXX/file-XXX.parquet``: one row per episode, LeRobot's column order, stats
  as (nested) lists of double (int64 for integer min/max and every count).
- ``meta/tasks.parquet``: ``task_index`` plus the pandas index column ``__index_level_0__`` holding
  the task string, with the pandas metadata that makes ``pd.read_parquet`` restore the index.
- ``meta/info.json`` and ``meta/stats.json``: JSON with LeRobot's indentation (:func:`meta_json_bytes`).

Arrays are built from numpy buffers, never through ``pa.array`` on Python or numpy values: that
imports pandas (see :func:`_primitive_array`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Final

import numpy as np
import pyarrow as pa

from hilrec.daemon.atomic import atomic_write_bytes, json_bytes
from hilrec.daemon.dataset.format.features import data_keys, is_video, video_keys
from hilrec.daemon.dataset.format.paths import (
    CODEBASE_VERSION,
    DATA_PATH,
    INFO_PATH,
    TASK_INDEX_COLUMN,
    VIDEO_PATH,
)
from hilrec.daemon.dataset.format.stats import STAT_KEYS

DEFAULT_CHUNK_SIZE: Final[int] = 1000
DEFAULT_DATA_FILE_SIZE_IN_MB: Final[int] = 100
DEFAULT_VIDEO_FILE_SIZE_IN_MB: Final[int] = 200
PARQUET_OPTIONS: Final[dict[str, Any]] = {"compression": "snappy", "use_dictionary": True}
MB: Final[int] = 1024 * 1024


# --- info.json -----------------------------------------------------------------------------------


def empty_info(
    *,
    fps: int,
    features: Mapping[str, Any],
    robot_type: str | None,
    chunks_size: int = DEFAULT_CHUNK_SIZE,
    data_files_size_in_mb: float = DEFAULT_DATA_FILE_SIZE_IN_MB,
    video_files_size_in_mb: float = DEFAULT_VIDEO_FILE_SIZE_IN_MB,
) -> dict[str, Any]:
    """info.json of a dataset with no episode yet, LeRobot's keys and order."""
    return {
        "codebase_version": CODEBASE_VERSION,
        "robot_type": robot_type,
        "total_episodes": 0,
        "total_frames": 0,
        "total_tasks": 0,
        "chunks_size": chunks_size,
        "data_files_size_in_mb": data_files_size_in_mb,
        "video_files_size_in_mb": video_files_size_in_mb,
        "fps": fps,
        "splits": {},
        "data_path": DATA_PATH,
        "video_path": VIDEO_PATH if video_keys(features) else None,
        "features": json.loads(json.dumps(features)),
    }


def meta_json_bytes(obj: Any) -> bytes:
    """The bytes of ``meta/info.json`` and ``meta/stats.json``, indented as LeRobot writes them."""
    return json_bytes(obj, indent=4, ensure_ascii=False)


def write_info(root: Path, info: Mapping[str, Any]) -> None:
    atomic_write_bytes(root / INFO_PATH, meta_json_bytes(info))


# --- parquet -------------------------------------------------------------------------------------


def _arrow_scalar(dtype: str) -> pa.DataType:
    return pa.from_numpy_dtype(np.dtype(dtype))


def data_schema(features: Mapping[str, Mapping[str, Any]]) -> pa.Schema:
    """The data-parquet schema, with the ``datasets`` feature description LeRobot writes."""
    fields = []
    hf: dict[str, Any] = {}
    for key in data_keys(features):
        spec = features[key]
        value = {"dtype": spec["dtype"], "_type": "Value"}
        if list(spec["shape"]) == [1]:
            fields.append(pa.field(key, _arrow_scalar(spec["dtype"])))
            hf[key] = value
        else:
            length = int(spec["shape"][0])
            fields.append(pa.field(key, pa.list_(_arrow_scalar(spec["dtype"]), length)))
            hf[key] = {"feature": value, "length": length, "_type": "List"}
    meta = {b"huggingface": json.dumps({"info": {"features": hf}}).encode()}
    return pa.schema(fields, metadata=meta)


def row_bytes(features: Mapping[str, Mapping[str, Any]]) -> int:
    """Bytes of one data-parquet row before compression (every non-video column's values)."""
    return sum(
        np.dtype(features[key]["dtype"]).itemsize * int(np.prod(features[key]["shape"]))
        for key in data_keys(features)
    )


def episode_data_table(columns: Mapping[str, np.ndarray], schema: pa.Schema) -> pa.Table:
    """Arrow table of one episode's rows; ``columns`` holds (n,) or (n, d) arrays per column."""
    arrays = []
    for field in schema:
        values = np.ascontiguousarray(columns[field.name])
        if pa.types.is_fixed_size_list(field.type):
            flat = _primitive_array(values.reshape(-1), field.type.value_type)
            arrays.append(pa.FixedSizeListArray.from_arrays(flat, field.type.list_size))
        else:
            arrays.append(_primitive_array(values.reshape(-1), field.type))
    return pa.Table.from_arrays(arrays, schema=schema)


def _primitive_array(values: np.ndarray, arrow_type: pa.DataType) -> pa.Array:
    # From the buffer directly: pa.array() (on numpy or on lists) imports pandas when it is
    # installed, which costs half a second and holds the GIL in the middle of a recording.
    if pa.types.is_boolean(arrow_type):
        bits = np.packbits(values.astype(bool), bitorder="little")
        return pa.Array.from_buffers(arrow_type, len(values), [None, pa.py_buffer(bits)])
    data = np.ascontiguousarray(values, dtype=arrow_type.to_pandas_dtype())
    return pa.Array.from_buffers(arrow_type, len(data), [None, pa.py_buffer(data)])


def arrow_array(values: Sequence[Any], arrow_type: pa.DataType) -> pa.Array:
    """An arrow array of ``arrow_type`` from Python values (numbers, strings, nested lists or
    numpy arrays), built from buffers as :func:`_primitive_array` is. No nulls."""
    if pa.types.is_list(arrow_type):
        offsets = np.zeros(len(values) + 1, dtype=np.int32)
        flat: list[Any] = []
        for i, value in enumerate(values):
            if value is None:
                raise ValueError(f"a null in a column of {arrow_type}")
            flat.extend(value)
            offsets[i + 1] = len(flat)
        return pa.ListArray.from_arrays(
            _primitive_array(offsets, pa.int32()), arrow_array(flat, arrow_type.value_type), type=arrow_type
        )
    if pa.types.is_string(arrow_type):
        encoded = [value.encode() for value in values]
        offsets = np.zeros(len(encoded) + 1, dtype=np.int32)
        np.cumsum([len(data) for data in encoded], out=offsets[1:])
        return pa.Array.from_buffers(
            arrow_type, len(encoded), [None, pa.py_buffer(offsets), pa.py_buffer(b"".join(encoded))]
        )
    return _primitive_array(np.asarray(values, dtype=arrow_type.to_pandas_dtype()), arrow_type)


# --- meta/episodes -------------------------------------------------------------------------------


def episodes_schema(features: Mapping[str, Mapping[str, Any]]) -> pa.Schema:
    """LeRobot 0.4.4's episodes-parquet columns, in its order."""
    fields = [
        pa.field("episode_index", pa.int64()),
        pa.field("tasks", pa.list_(pa.string())),
        pa.field("length", pa.int64()),
        pa.field("data/chunk_index", pa.int64()),
        pa.field("data/file_index", pa.int64()),
        pa.field("dataset_from_index", pa.int64()),
        pa.field("dataset_to_index", pa.int64()),
    ]
    for key in video_keys(features):
        fields += [
            pa.field(f"videos/{key}/chunk_index", pa.int64()),
            pa.field(f"videos/{key}/file_index", pa.int64()),
            pa.field(f"videos/{key}/from_timestamp", pa.float64()),
            pa.field(f"videos/{key}/to_timestamp", pa.float64()),
        ]
    for key, spec in features.items():
        fields += [pa.field(f"stats/{key}/{name}", _stat_type(spec, name)) for name in STAT_KEYS]
    fields += [
        pa.field("meta/episodes/chunk_index", pa.int64()),
        pa.field("meta/episodes/file_index", pa.int64()),
    ]
    return pa.schema(fields)


def _stat_type(spec: Mapping[str, Any], name: str) -> pa.DataType:
    if name == "count":
        return pa.list_(pa.int64())
    if is_video(spec):
        return pa.list_(pa.list_(pa.list_(pa.float64())))
    integral = np.dtype(spec["dtype"]).kind in "iub"
    if integral and name in ("min", "max"):
        return pa.list_(pa.int64())
    return pa.list_(pa.float64())


def episodes_table(
    rows: Sequence[Mapping[str, Any]],
    features: Mapping[str, Mapping[str, Any]],
) -> pa.Table:
    """Arrow table of episode rows. Stats columns may be numpy arrays or lists."""
    schema = episodes_schema(features)
    return pa.Table.from_arrays(
        [arrow_array([row[field.name] for row in rows], field.type) for field in schema], schema=schema
    )


# --- meta/tasks.parquet --------------------------------------------------------------------------


def tasks_table(tasks: Sequence[str]) -> pa.Table:
    """tasks.parquet as LeRobot writes it through pandas (task string in the index)."""
    pandas_meta = {
        "index_columns": [TASK_INDEX_COLUMN],
        "column_indexes": [
            {
                "name": None,
                "field_name": None,
                "pandas_type": "unicode",
                "numpy_type": "object",
                "metadata": {"encoding": "UTF-8"},
            }
        ],
        "columns": [
            {
                "name": "task_index",
                "field_name": "task_index",
                "pandas_type": "int64",
                "numpy_type": "int64",
                "metadata": None,
            },
            {
                "name": None,
                "field_name": TASK_INDEX_COLUMN,
                "pandas_type": "unicode",
                "numpy_type": "object",
                "metadata": None,
            },
        ],
        "attributes": {},
        "creator": {"library": "pyarrow", "version": pa.__version__},
        "pandas_version": "2.2.3",
    }
    schema = pa.schema(
        [pa.field("task_index", pa.int64()), pa.field(TASK_INDEX_COLUMN, pa.string())],
        metadata={b"pandas": json.dumps(pandas_meta).encode()},
    )
    return pa.Table.from_arrays(
        [arrow_array(range(len(tasks)), pa.int64()), arrow_array(list(tasks), pa.string())], schema=schema
    )
