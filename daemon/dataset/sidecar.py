"""What goes *beside* a dataset: everything that is not a measurable feature.

LeRobot reads ``meta/``, ``data/`` and ``videos/`` and ignores the rest, so hilrec keeps its own
files under ``<root>/hilrec/``:

- ``hilrec/dataset.json``: per dataset (versions, hashes, timestep/substeps/fps, units mapping,
  calibration, writer provenance).
- ``hilrec/episodes/episode-NNNNNN.json``: per episode (seed, task, success and its criterion,
  disturbances, twin divergence summary, timing summary...).
- ``hilrec/episodes/episode-NNNNNN.npz``: per-episode arrays (tick start times, durations,
  overrun flags, the full initial simulator state...).

Every write is atomic (see :mod:`hilrec.daemon.atomic`).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from hilrec.daemon.atomic import atomic_write_bytes, atomic_write_json, json_bytes, npz_bytes
from hilrec.daemon.errors import CorruptDatasetError

SIDECAR_DIR = "hilrec"
DATASET_FILE = "dataset.json"
EPISODES_DIR = "episodes"


def sidecar_dir(root: str | os.PathLike[str]) -> Path:
    return Path(root) / SIDECAR_DIR


def episode_json_path(root: str | os.PathLike[str], episode_index: int) -> Path:
    return sidecar_dir(root) / EPISODES_DIR / f"episode-{episode_index:06d}.json"


def episode_npz_path(root: str | os.PathLike[str], episode_index: int) -> Path:
    return sidecar_dir(root) / EPISODES_DIR / f"episode-{episode_index:06d}.npz"


def write_dataset_sidecar(root: str | os.PathLike[str], data: Mapping[str, Any]) -> None:
    atomic_write_json(sidecar_dir(root) / DATASET_FILE, dict(data))


def update_dataset_sidecar(root: str | os.PathLike[str], data: Mapping[str, Any]) -> dict[str, Any]:
    """Merge ``data`` (top-level keys) into ``hilrec/dataset.json`` and return the result."""
    merged = load_dataset_sidecar(root) or {}
    merged.update(data)
    write_dataset_sidecar(root, merged)
    return merged


def load_dataset_sidecar(root: str | os.PathLike[str]) -> dict[str, Any] | None:
    return _load_json(sidecar_dir(root) / DATASET_FILE)


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
    meta = _load_json(episode_json_path(root, episode_index))
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


def _load_json(path: Path) -> dict[str, Any] | None:
    if not path.exists():
        return None
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise CorruptDatasetError(str(path), f"cannot read JSON: {exc}") from exc
