"""Durable file writes: temp file, fsync, rename, fsync of the directory.

A reader (or a crash) sees either the old file or the new one, never a torn one, and once a call
returns the new content survives a power loss.
"""

from __future__ import annotations

import io
import json
import os
from pathlib import Path
from typing import Any

import numpy as np


def fsync_dir(path: str | os.PathLike[str]) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(tmp, "wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    fsync_dir(path.parent)


def json_bytes(obj: Any) -> bytes:
    """The bytes :func:`atomic_write_json` writes (indented, numpy values as plain JSON)."""
    return (json.dumps(obj, indent=2, default=_json_default) + "\n").encode()


def npz_bytes(arrays: dict[str, np.ndarray]) -> bytes:
    """The bytes :func:`atomic_write_npz` writes (``np.savez``, uncompressed)."""
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    return buf.getvalue()


def atomic_write_json(path: str | os.PathLike[str], obj: Any) -> None:
    atomic_write_bytes(path, json_bytes(obj))


def atomic_write_npz(path: str | os.PathLike[str], arrays: dict[str, np.ndarray]) -> None:
    atomic_write_bytes(path, npz_bytes(arrays))


def atomic_replace(tmp: str | os.PathLike[str], path: str | os.PathLike[str]) -> None:
    """Publish a fully written ``tmp`` at ``path`` (fsyncs ``tmp`` first)."""
    fd = os.open(tmp, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    os.replace(tmp, path)
    fsync_dir(Path(path).parent)


def _json_default(obj: Any) -> Any:
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, Path):
        return str(obj)
    raise TypeError(f"not JSON serialisable: {type(obj).__name__}")
