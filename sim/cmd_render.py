"""``hilrec render ROOT --out NEWROOT --camera NAME --size WxH``: regenerate sim pixels.

A sim episode's camera frames are a function of its start state and its actions, so they can be
rebuilt at any resolution, from any camera in the scene, long after recording. Each episode is
replayed on the twin (start state, actions, recorded disturbances) and the camera rendered at
every frame, after the observation and before the frame acts, exactly where the recorder
renders. The new dataset's ``action`` and ``observation.state`` columns are the recorded arrays
themselves; before a frame is written the replayed observation is checked against the recorded
one, so pixels are never drawn from a state the recording did not have.
"""

from __future__ import annotations

import argparse
import copy
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from hilrec.daemon.config import flag_errors
from hilrec.daemon.dataset import (
    FrameSink,
    load_dataset_sidecar,
    load_episode_sidecar,
    load_episodes,
    load_info,
    load_tasks,
    read_episode,
)
from hilrec.daemon.errors import ReplayError
from hilrec.daemon.so101 import ACTION_KEY, IMAGE_PREFIX, STATE_KEY, robot_type
from hilrec.sim.cmd_record import describe_shape, parse_cameras, parse_size
from hilrec.sim.episode import Push
from hilrec.sim.features import sim_features
from hilrec.sim.provenance import SIDECAR_KEY, scene_from_sidecar
from hilrec.sim.replay import run_actions
from hilrec.sim.scene import Visual
from hilrec.sim.twin import Twin

_NUMERIC = {ACTION_KEY, STATE_KEY}
_DEFAULT_KEYS = {"timestamp", "frame_index", "episode_index", "index", "task_index"}


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "render", help="re-render the camera videos of sim episodes", description=__doc__.splitlines()[0]
    )
    parser.add_argument("root", type=Path, metavar="ROOT", help="a sim dataset")
    parser.add_argument("--out", type=Path, required=True, help="new dataset directory")
    parser.add_argument(
        "--camera", required=True, help="camera(s) of the scene, comma-separated (e.g. front or front,wrist)"
    )
    parser.add_argument(
        "--size",
        required=True,
        metavar="WxH",
        help="image size, width x height as video tools write it, e.g. 320x240 (240 rows of 320 "
        "pixels; 240x320 is portrait)",
    )
    parser.add_argument(
        "--quality",
        choices=("fast", "full"),
        default="fast",
        help="arm meshes: simplified (fast, default) or as shipped (full)",
    )
    parser.add_argument("--video-codec", default="libsvtav1", help="video encoder")
    parser.set_defaults(func=run)
    return parser


def run(args: argparse.Namespace) -> int:
    with flag_errors({"size": "--size", "cameras": "--camera"}):
        cameras = parse_cameras(args.camera)
        size = parse_size(args.size)
    if not cameras:
        raise ReplayError("render needs at least one camera")
    began = time.perf_counter()
    frames, episodes = render_dataset(
        args.root,
        args.out,
        cameras=cameras,
        size=size,
        quality=args.quality,
        video_codec=args.video_codec,
    )
    print(
        f"rendered {episodes} episodes, {frames} frames ({', '.join(cameras)}, images "
        f"{describe_shape(size)}) "
        f"in {time.perf_counter() - began:.1f} s -> {args.out}",
        file=sys.stdout,
    )
    return 0


def render_dataset(
    root: Path,
    out: Path,
    *,
    cameras: tuple[str, ...],
    size: tuple[int, int],
    quality: Visual = "fast",
    video_codec: str = "libsvtav1",
) -> tuple[int, int]:
    """Write a copy of the sim dataset at ``root`` to ``out`` with new camera videos."""
    from hilrec.daemon.dataset import DatasetWriter, update_dataset_sidecar

    root, out = Path(root), Path(out)
    info = load_info(root)
    extra = sorted(
        k
        for k, ft in info["features"].items()
        if k not in _NUMERIC | _DEFAULT_KEYS and ft.get("dtype") not in ("video", "image")
    )
    if extra:
        raise ReplayError(
            f"{root}: features {', '.join(extra)} are not sim columns; "
            "render only rebuilds sim datasets (action, observation.state, cameras)"
        )
    tasks = load_tasks(root)
    dataset_sidecar = load_dataset_sidecar(root) or {}
    scene = scene_from_sidecar(dataset_sidecar, root)
    features = sim_features(dict.fromkeys(cameras, size), arms=scene.arms)
    frames_written = 0
    indices = [int(row["episode_index"]) for row in load_episodes(root)]
    with Twin(
        fps=int(info["fps"]), cameras=cameras, image_size=size, scene=scene, render_quality=quality
    ) as twin:
        sink = DatasetWriter.create(
            out,
            fps=int(info["fps"]),
            features=features,
            robot_type=info.get("robot_type") or robot_type(scene.arms),
            video_codec=video_codec,
            lock_command=f"hilrec render {root}",  # the new root is locked while it is written
            realtime=False,
        )
        with sink:
            update_dataset_sidecar(out, _new_dataset_sidecar(dataset_sidecar, root, cameras, size, quality))
            for index in indices:
                frames_written += _render_episode(root, index, twin, sink, tasks)
    return frames_written, len(indices)


def _new_dataset_sidecar(
    original: dict[str, Any], root: Path, cameras: tuple[str, ...], size: tuple[int, int], quality: str
) -> dict[str, Any]:
    fields = {k: copy.deepcopy(v) for k, v in original.items() if k != "writer"}
    sim = fields.setdefault(SIDECAR_KEY, {})
    sim["cameras"] = {name: list(size) for name in cameras}
    sim["render_quality"] = quality
    fields["rendered_from"] = {
        "root": str(root.resolve()),
        "cameras": list(cameras),
        "size": list(size),
        "quality": quality,
        "original_cameras": original.get(SIDECAR_KEY, {}).get("cameras"),
    }
    return fields


def _render_episode(root: Path, index: int, twin: Twin, sink: FrameSink, tasks: dict[int, str]) -> int:
    where = f"{root} episode {index}"
    meta, arrays = load_episode_sidecar(root, index)
    if meta is None or "initial_state" not in arrays:
        raise ReplayError(
            f"{where}: no recorded start state (hilrec/episodes/"
            f"episode-{index:06d}); only sim episodes can be re-rendered"
        )
    columns = read_episode(root, index, [ACTION_KEY, STATE_KEY, "task_index"])
    actions, states = columns[ACTION_KEY], columns[STATE_KEY]
    task_index = columns["task_index"].reshape(-1)
    pushes = [Push.from_dict(p, where) for p in (meta.get("sim") or {}).get("disturbances") or []]

    def write_frame(frame: int, observation: np.ndarray) -> None:
        if not np.array_equal(observation, states[frame]):
            raise ReplayError(
                f"{where}: the replay leaves the recorded states at frame {frame} "
                "('hilrec check --replay' shows where); refusing to draw pixels "
                "of states the recording did not have"
            )
        row: dict[str, Any] = {
            STATE_KEY: states[frame],
            ACTION_KEY: actions[frame],
            "task": tasks[int(task_index[frame])],
        }
        for camera in twin.cameras:
            row[IMAGE_PREFIX + camera] = twin.render(camera)
        sink.add_frame(row)

    try:
        run_actions(twin, arrays["initial_state"], actions, pushes, on_observe=write_frame)
    except BaseException:
        sink.discard_episode()
        raise
    sidecar = dict(meta)
    sidecar.pop("episode_index", None)
    sidecar.pop("has_arrays", None)
    sidecar["rendered_from"] = {"root": str(root.resolve()), "episode_index": index}
    sink.save_episode(sidecar=sidecar, arrays=arrays)
    return len(actions)
