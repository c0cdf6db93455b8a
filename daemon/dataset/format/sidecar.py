"""What goes *beside* a dataset: everything that is not a measurable feature.

LeRobot reads ``meta/``, ``data/`` and ``videos/`` and ignores the rest, so hilrec keeps its own
files under ``<root>/hilrec/``:

- ``hilrec/dataset.json``: per dataset (versions, hashes, timestep/substeps/fps, units mapping,
  calibration, writer provenance).
- ``hilrec/episodes/episode-NNNNNN.json``: per episode (seed, task, success and its criterion,
  disturbances, twin divergence summary, timing summary...).
- ``hilrec/episodes/episode-NNNNNN.npz``: per-episode arrays (tick start times, durations,
  overrun flags, the full initial simulator state...).

The journal of saved episodes also lives there, in ``hilrec/journal/`` (see :mod:`.journal`).
Every write is atomic (see :mod:`hilrec.daemon.atomic`).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

import numpy as np

from hilrec.daemon.atomic import atomic_write_bytes, atomic_write_json, json_bytes, npz_bytes, read_json
from hilrec.daemon.errors import CorruptDatasetError

SIDECAR_DIR: Final[str] = "hilrec"
DATASET_FILE: Final[str] = "dataset.json"
EPISODES_DIR: Final[str] = "episodes"
_EPISODE_FILE = re.compile(r"^episode-(\d+)\.")


def sidecar_dir(root: str | os.PathLike[str]) -> Path:
    return Path(root) / SIDECAR_DIR


def episodes_sidecar_dir(root: str | os.PathLike[str]) -> Path:
    return sidecar_dir(root) / EPISODES_DIR


def episode_json_path(root: str | os.PathLike[str], episode_index: int) -> Path:
    return episodes_sidecar_dir(root) / f"episode-{episode_index:06d}.json"


def episode_npz_path(root: str | os.PathLike[str], episode_index: int) -> Path:
    return episodes_sidecar_dir(root) / f"episode-{episode_index:06d}.npz"


def stored_episode_sidecars(root: str | os.PathLike[str]) -> list[tuple[int, Path]]:
    """(episode_index, path) of every per-episode sidecar file on disk, by path."""
    directory = episodes_sidecar_dir(root)
    if not directory.is_dir():
        return []
    found = []
    for path in sorted(directory.glob("episode-*")):
        match = _EPISODE_FILE.match(path.name)
        if match:
            found.append((int(match.group(1)), path))
    return found


def renumber_episode_sidecar(root: str | os.PathLike[str], old: int, new: int) -> None:
    """Give episode ``old``'s sidecar files episode ``new``'s names; the JSON notes the change."""
    for src, dst in (
        (episode_json_path(root, old), episode_json_path(root, new)),
        (episode_npz_path(root, old), episode_npz_path(root, new)),
    ):
        if not src.exists():
            continue
        if src.suffix == ".json":
            payload = read_json(src)
            payload["episode_index"] = new
            payload["renumbered_from"] = old
            # A renumbered sidecar has always been written without the final newline.
            atomic_write_bytes(src, json_bytes(payload, final_newline=False))
        os.replace(src, dst)


def write_dataset_sidecar(root: str | os.PathLike[str], data: Mapping[str, Any]) -> None:
    atomic_write_json(sidecar_dir(root) / DATASET_FILE, dict(data))


def update_dataset_sidecar(root: str | os.PathLike[str], data: Mapping[str, Any]) -> dict[str, Any]:
    """Merge ``data`` (top-level keys) into ``hilrec/dataset.json`` and return the result."""
    merged = load_dataset_sidecar(root) or {}
    merged.update(data)
    write_dataset_sidecar(root, merged)
    return merged


def load_dataset_sidecar(root: str | os.PathLike[str]) -> dict[str, Any] | None:
    return read_json(sidecar_dir(root) / DATASET_FILE, if_missing=None)


def write_episode_sidecar(
    root: str | os.PathLike[str],
    episode_index: int,
    data: Mapping[str, Any] | None,
    arrays: Mapping[str, np.ndarray] | None = None,
) -> None:
    for path, content in episode_sidecar_files(root, episode_index, data, arrays).items():
        atomic_write_bytes(path, content)


def episode_sidecar_files(
    root: str | os.PathLike[str],
    episode_index: int,
    data: Mapping[str, Any] | None,
    arrays: Mapping[str, np.ndarray] | None = None,
) -> dict[Path, bytes]:
    """The episode's sidecar files and their bytes, in the order they must be published: the
    JSON goes last, its presence says the episode's sidecar is complete."""
    files: dict[Path, bytes] = {}
    if arrays:
        files[episode_npz_path(root, episode_index)] = npz_bytes(
            {k: np.asarray(v) for k, v in arrays.items()}
        )
    payload = dict(data or {})
    payload["episode_index"] = episode_index
    payload["has_arrays"] = bool(arrays)
    files[episode_json_path(root, episode_index)] = json_bytes(payload)
    return files


def load_episode_sidecar(
    root: str | os.PathLike[str], episode_index: int
) -> tuple[dict[str, Any] | None, dict[str, np.ndarray]]:
    """Return (json, arrays) for one episode; (None, {}) when it has no sidecar."""
    meta = read_json(episode_json_path(root, episode_index), if_missing=None)
    if meta is None:
        return None, {}
    arrays: dict[str, np.ndarray] = {}
    npz = episode_npz_path(root, episode_index)
    if meta.get("has_arrays") and npz.exists():
        try:
            with np.load(npz, allow_pickle=False) as data:
                arrays = {k: data[k] for k in data.files}
        except (OSError, ValueError) as exc:
            raise CorruptDatasetError(str(npz), f"cannot read episode arrays: {exc}") from exc
    return meta, arrays
