"""Export a LeRobot v3.0 dataset to robomimic's HDF5 layout (which Alloy and others read too).

The file is robomimic's (its ``SequenceDataset`` reads it as written)::

    data/                 attrs: total (samples), env_args (JSON: what this data came from)
      demo_<episode>/     attrs: num_samples, task, tasks, hilrec_episode_index
        actions           float32 (n, 6), the recorded action column, unchanged (two arms: (n, 12))
        obs/state         float32 (n, 6), observation.state (two arms: (n, 12), left arm first)
        obs/<cam>_image   uint8 (n, H, W, 3), decoded from the episode's video ("image" in the
                          name is how robomimic's configs recognise an RGB key)
        next_obs/<key>    obs/<key> one frame on, the last frame repeated: a virtual dataset
                          over obs/<key>, so the images are not stored twice
        rewards, dones    float64 / int64 (n,): 1 on the last frame of a successful episode
        states            float64 (n, S): the full simulator state before each frame (sim only)
    mask/all, mask/success    the demo names, as robomimic's filter keys

``next_obs`` is laid out as robomimic's converters write it (``convert_d4rl.py``: the observation
after each frame, and at an episode's end a copy of its last observation, since nothing was
observed after it); ``SequenceDataset`` reads it by default (``load_next_obs=True``).

``env_args`` names the columns of both (``env_kwargs.names``: the dataset's feature names, e.g.
``left_shoulder_pan.pos ... right_gripper.pos`` for LeRobot's bi_so_follower), so which values
are which arm's travels with the file.

``task`` is the episode's task as the dataset holds it (``meta/tasks.parquet`` through each row's
``task_index``), the first if the episode holds several; ``tasks`` lists them all, in order.

``states`` is not in the dataset (it is not measurable on a real arm): it is rebuilt by replaying
the episode on the twin from its recorded start state, the same bit-exact replay as ``hilrec
check --replay``, and kept only when the replay reproduces every recorded observation. A
hardware episode has no simulator state, and the report says so instead of inventing one.

The file is written beside its destination and renamed into place, so a crash or an error never
leaves a partial export where the destination should be.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import cv2
import h5py
import numpy as np

from hilrec.daemon.atomic import temp_path
from hilrec.daemon.dataset import (
    load_dataset_sidecar,
    load_episode_sidecar,
    load_episodes,
    load_info,
    load_tasks,
    read_episode,
    read_episode_frames,
)
from hilrec.daemon.errors import CorruptDatasetError, DatasetError, HilrecError
from hilrec.daemon.so101 import ACTION_KEY, IMAGE_PREFIX, STATE_KEY
from hilrec.daemon.tools.episode_ranges import episode_list


@dataclass
class ExportReport:
    out: Path
    demos: int = 0
    samples: int = 0
    successes: int = 0
    with_states: int = 0
    notes: list[str] = field(default_factory=list)  # what could not be carried over, and why

    def format_text(self) -> str:
        lines = [
            f"exported {self.demos} episode(s), {self.samples} samples, to {self.out}",
            f"  success mask: {self.successes} of {self.demos}; "
            f"simulator states: {self.with_states} of {self.demos}",
        ]
        lines += [f"  not carried over: {note}" for note in self.notes]
        return "\n".join(lines)


def export_robomimic(
    root: Path,
    out: Path,
    *,
    episodes: Iterable[int] | None = None,
    size: tuple[int, int] | None = None,
    overwrite: bool = False,
) -> ExportReport:
    """Write the dataset at ``root`` to ``out`` in robomimic's layout; ``size`` is (width, height)."""
    root, out = Path(root), Path(out)
    if out.exists() and not overwrite:
        raise DatasetError(f"{out} exists; give another --out or remove it first")
    if not out.parent.is_dir():
        raise DatasetError(f"{out.parent}: no such folder for --out")
    info = load_info(root)
    features = info["features"]
    for key in (ACTION_KEY, STATE_KEY):
        if key not in features:
            raise DatasetError(f"{root}: no '{key}' feature; robomimic needs actions and a state")
    cameras = [k[len(IMAGE_PREFIX) :] for k, spec in features.items() if k.startswith(IMAGE_PREFIX)]
    video = [c for c in cameras if features[IMAGE_PREFIX + c]["dtype"] == "video"]
    rows = load_episodes(root)
    present = [int(r["episode_index"]) for r in rows]
    wanted = None if episodes is None else set(episode_list(episodes, max(present, default=-1) + 1, root))
    indices = [index for index in present if wanted is None or index in wanted]
    if wanted is not None and sorted(wanted - set(indices)):
        raise DatasetError(f"{root}: no episode {sorted(wanted - set(indices))[:5]}")
    report = ExportReport(out=out)
    if len(video) != len(cameras):
        report.notes.append("image features stored as images, not video: only video features are exported")
    replayer = _Replayer.for_dataset(root, info)
    if replayer.problem:
        report.notes.append(f"simulator states: {replayer.problem}")
    tasks = load_tasks(root) if indices else {}
    tmp = temp_path(out)
    try:
        with h5py.File(tmp, "w") as f:
            data = f.create_group("data")
            names: list[str] = []
            successful: list[str] = []
            for index in indices:
                name = f"demo_{index}"
                demo = data.create_group(name)
                success = _write_demo(demo, root, index, video, size, replayer, report)
                _write_task(demo, root, index, tasks)
                names.append(name)
                if success:
                    successful.append(name)
            data.attrs["total"] = report.samples
            data.attrs["env_args"] = json.dumps(_env_args(root, info, video, size))
            mask = f.create_group("mask")
            mask.create_dataset("all", data=np.array(names, dtype="S"))
            mask.create_dataset("success", data=np.array(successful, dtype="S"))
        with open(tmp, "rb") as written:
            os.fsync(written.fileno())
        os.replace(tmp, out)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    finally:
        replayer.close()
    report.demos, report.successes = len(indices), len(successful)
    return report


def _write_demo(
    demo: h5py.Group,
    root: Path,
    index: int,
    cameras: list[str],
    size: tuple[int, int] | None,
    replayer: _Replayer,
    report: ExportReport,
) -> bool:
    columns = read_episode(root, index, [ACTION_KEY, STATE_KEY])
    actions, observed = columns[ACTION_KEY], columns[STATE_KEY]
    n = len(actions)
    meta, arrays = load_episode_sidecar(root, index)
    success = bool((meta or {}).get("success", (meta or {}).get("success_reported")) or False)
    demo.attrs["num_samples"] = n
    demo.attrs["hilrec_episode_index"] = index
    demo.create_dataset("actions", data=actions)
    obs = demo.create_group("obs")
    next_obs = demo.create_group("next_obs")
    _write_obs(obs, next_obs, "state", obs.create_dataset("state", data=observed))
    for camera in cameras:
        frames = read_episode_frames(root, index, IMAGE_PREFIX + camera)
        if size is not None:
            frames = np.stack([cv2.resize(f, size, interpolation=cv2.INTER_AREA) for f in frames])
        key = f"{camera}_image"
        _write_obs(
            obs, next_obs, key, obs.create_dataset(key, data=frames, compression="gzip", compression_opts=4)
        )
    rewards = np.zeros(n, dtype=np.float64)
    dones = np.zeros(n, dtype=np.int64)
    if success and n:
        rewards[-1], dones[-1] = 1.0, 1
    demo.create_dataset("rewards", data=rewards)
    demo.create_dataset("dones", data=dones)
    states, why = replayer.states(meta, arrays, actions, observed, index)
    if states is not None:
        demo.create_dataset("states", data=states)
        report.with_states += 1
    elif why and replayer.problem is None:
        report.notes.append(f"episode {index}: simulator states: {why}")
    report.samples += n
    return success


def _write_obs(obs: h5py.Group, next_obs: h5py.Group, key: str, written: h5py.Dataset) -> None:
    """``next_obs/<key>``: frame i+1 for frame i, the last frame for itself (robomimic's layout)."""
    n = written.shape[0]
    if n == 0:
        next_obs.create_dataset(key, shape=written.shape, dtype=written.dtype)
        return
    layout = h5py.VirtualLayout(shape=written.shape, dtype=written.dtype)
    # "." is this file whatever it is called, so the rename into place keeps the link.
    source = h5py.VirtualSource(".", f"{obs.name}/{key}", shape=written.shape)
    layout[: n - 1] = source[1:n]
    layout[n - 1 :] = source[n - 1 : n]
    next_obs.create_virtual_dataset(key, layout)


def _write_task(demo: h5py.Group, root: Path, index: int, tasks: dict[int, str]) -> None:
    """The episode's tasks as the dataset holds them: its rows' task_index into meta/tasks."""
    column = read_episode(root, index, ["task_index"])["task_index"].reshape(-1)
    _, first = np.unique(column, return_index=True)
    used = [int(column[i]) for i in sorted(first)]
    missing = [i for i in used if i not in tasks]
    if missing:
        raise CorruptDatasetError(
            f"{root}/meta/tasks.parquet", f"has no task_index {missing}, which episode {index} uses"
        )
    names = [tasks[i] for i in used]
    demo.attrs["task"] = names[0] if names else ""
    demo.attrs["tasks"] = json.dumps(names)


class _Replayer:
    """The twin a sim dataset was recorded in, for rebuilding its per-frame states."""

    def __init__(self, twin: Any = None, problem: str | None = None) -> None:
        self.twin = twin
        self.problem = problem

    @classmethod
    def for_dataset(cls, root: Path, info: dict[str, Any]) -> _Replayer:
        sidecar = load_dataset_sidecar(root)
        if not sidecar or "sim" not in sidecar:
            return cls(problem="a hardware (or foreign) dataset has no simulator state")
        from hilrec.sim.provenance import scene_from_sidecar
        from hilrec.sim.twin import Twin

        try:
            twin = Twin(fps=int(info["fps"]), cameras=(), scene=scene_from_sidecar(sidecar, root))
        except HilrecError as exc:
            return cls(problem=f"the twin this dataset was recorded in cannot be built: {exc}")
        return cls(twin=twin)

    def states(
        self,
        meta: dict[str, Any] | None,
        arrays: dict[str, np.ndarray],
        actions: np.ndarray,
        observed: np.ndarray,
        index: int,
    ) -> tuple[np.ndarray | None, str | None]:
        if self.twin is None:
            return None, None
        if meta is None or "initial_state" not in arrays:
            return None, "no recorded start state"
        from hilrec.sim.episode import Push
        from hilrec.sim.replay import run_actions

        twin = self.twin
        states = np.empty((len(actions), twin.state_size), dtype=np.float64)

        def keep(frame: int, _: np.ndarray) -> None:
            states[frame] = twin.get_state()

        pushes = [
            Push.from_dict(p, f"episode {index}") for p in (meta.get("sim") or {}).get("disturbances") or []
        ]
        replayed, _ = run_actions(twin, arrays["initial_state"], actions, pushes, on_observe=keep)
        if not np.array_equal(replayed, observed):
            rows = int(np.sum(np.any(replayed != observed, axis=1)))
            why = f"the replay differs from the recording in {rows} rows: its states are not this episode's"
            return None, why
        return states, None

    def close(self) -> None:
        if self.twin is not None:
            self.twin.close()


def _env_args(
    root: Path, info: dict[str, Any], cameras: list[str], size: tuple[int, int] | None
) -> dict[str, Any]:
    sidecar = load_dataset_sidecar(root) or {}
    return {
        "env_name": f"hilrec-{info.get('robot_type', 'so_follower')}",
        "type": "hilrec",  # not a robomimic EnvType: this data replays on hilrec's twin, not robosuite
        "env_kwargs": {
            "fps": info.get("fps"),
            "robot_type": info.get("robot_type"),
            "source_dataset": str(root),
            "cameras": cameras,
            "image_size_wh": list(size) if size else None,
            "units": sidecar.get("units"),
            "names": {
                "actions": list(info["features"][ACTION_KEY].get("names") or []),
                "obs/state": list(info["features"][STATE_KEY].get("names") or []),
            },
            "sim": {k: sidecar["sim"][k] for k in ("scene", "physics") if k in sidecar.get("sim", {})},
        },
    }
