"""Durable file writes: temp file, fsync, rename, fsync of the directory; and the JSON they hold.

A reader (or a crash) sees either the old file or the new one, never a torn one, and once a call
returns the new content survives a power loss. This module is the one place that names a temp
file (:func:`temp_path`, recognised by :func:`is_temp_name`), so the repair that sweeps temp files
after a crash finds every one. JSON is encoded by :func:`json_bytes` (each file keeps its own
indentation, so its bytes match what LeRobot or the reader of that file expects) and read back by
:func:`read_json`, which names the file in a :class:`CorruptDatasetError` when it cannot.
"""

from __future__ import annotations

import io
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

import numpy as np

from hilrec.daemon.errors import CorruptDatasetError

PathLike = str | os.PathLike[str]
_TEMP_MARK: Final[str] = ".tmp-"


def temp_path(path: PathLike) -> Path:
    """The hidden temp file a write of ``path`` goes through: ``.<name>.tmp-<pid>`` beside it."""
    path = Path(path)
    return path.with_name(f".{path.name}{_TEMP_MARK}{os.getpid()}")


def is_temp_name(name: str) -> bool:
    """Whether a file name is one :func:`temp_path` makes (left behind by a crash)."""
    return name.startswith(".") and _TEMP_MARK in name


def fsync_dir(path: PathLike) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_file(path: PathLike) -> None:
    """Flush a file written by someone else (an encoder, pyarrow) to disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_synced(path: PathLike, data: bytes) -> None:
    """Write ``data`` to ``path`` in place and fsync it; no rename, the caller publishes it."""
    with open(path, "wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())


def atomic_write_bytes(path: PathLike, data: bytes) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = temp_path(path)
    write_synced(tmp, data)
    os.replace(tmp, path)
    fsync_dir(path.parent)


def json_bytes(
    obj: Any, *, indent: int | None = 2, ensure_ascii: bool = True, final_newline: bool = True
) -> bytes:
    """``obj`` as JSON bytes, numpy values and paths as plain JSON.

    The defaults are hilrec's own files (sidecars, reports). LeRobot's ``info.json`` and
    ``stats.json`` use ``indent=4, ensure_ascii=False``; its calibration files have no final newline;
    journal entries are compact (``indent=None``).
    """
    text = json.dumps(obj, indent=indent, ensure_ascii=ensure_ascii, default=_json_default)
    return (text + "\n" if final_newline else text).encode()


def npz_bytes(arrays: Mapping[str, np.ndarray]) -> bytes:
    """``np.savez`` of ``arrays``, uncompressed."""
    buf = io.BytesIO()
    # allow_pickle is numpy's default, spelled out so that no array name can be taken for it.
    np.savez(buf, allow_pickle=True, **arrays)
    return buf.getvalue()


def atomic_write_json(path: PathLike, obj: Any, *, indent: int | None = 2) -> None:
    atomic_write_bytes(path, json_bytes(obj, indent=indent))


def read_json(path: PathLike, *, what: str = "JSON", if_missing: str | None = "missing") -> Any:
    """The parsed content of a JSON file.

    A missing file raises :class:`CorruptDatasetError` with the problem ``if_missing``, or returns
    None when ``if_missing`` is None; an unreadable one raises it as ``unreadable <what>: ...``.
    """
    try:
        data = Path(path).read_bytes()
    except FileNotFoundError as exc:
        if if_missing is None:
            return None
        raise CorruptDatasetError(str(path), if_missing) from exc
    except OSError as exc:
        raise CorruptDatasetError(str(path), f"unreadable {what}: {exc}") from exc
    try:
        return json.loads(data)
    except ValueError as exc:  # JSONDecodeError and UnicodeDecodeError both are
        raise CorruptDatasetError(str(path), f"unreadable {what}: {exc}") from exc


def _json_default(obj: object) -> Any:
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, Path):
        return str(obj)
    raise TypeError(f"not JSON serialisable: {type(obj).__name__}")
