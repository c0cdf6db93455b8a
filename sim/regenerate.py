"""A sim episode's missing video, made again on the twin for ``hilrec repair``.

A sim episode's frames are a function of its start state and its actions (see ``hilrec
render``): when its mp4 is gone (a file shared by several episodes deleted, say), the rebuild
need not drop it. :func:`sim_regenerator` gives ``repair`` a :data:`~.rebuild.Regenerate` that
replays the episode's recorded actions from its recorded start state on the twin, checks every
replayed observation against the recorded one (pixels are never drawn from a state the
recording did not have), renders the camera at each frame where the recorder rendered it, and
encodes the frames with the dataset's codec at LeRobot's settings. The pixels are the twin's at
its ``fast`` render quality, not the lost file's bytes; the report says they were re-rendered.

This is the only part of ``hilrec repair`` that needs MuJoCo, which it imports only when a sim
dataset is missing a video.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Final

import numpy as np
import pyarrow as pa

from hilrec.daemon.dataset import (
    Regenerate,
    StreamEncoder,
    VideoSettings,
    column_to_numpy,
    load_dataset_sidecar,
    load_episode_sidecar,
)
from hilrec.daemon.errors import CorruptDatasetError, ReplayError
from hilrec.daemon.so101 import ACTION_KEY, IMAGE_PREFIX, STATE_KEY

# info.json's video.codec and the encoder that writes it.
ENCODER_OF_CODEC: Final[dict[str, str]] = {"av1": "libsvtav1", "h264": "libx264", "hevc": "libx265"}


def sim_regenerator(root: Path, info: dict[str, Any]) -> Regenerate | None:
    """The twin's regeneration for the sim dataset at ``root``; None when it is not one."""
    try:
        dataset_sidecar = load_dataset_sidecar(root)
    except CorruptDatasetError:
        return None
    if not dataset_sidecar or "sim" not in dataset_sidecar:
        return None
    fps = int(info["fps"])
    features: dict[str, Any] = info["features"]

    def regenerate(episode: int, key: str, rows: pa.Table, out: Path) -> str | None:
        meta, arrays = load_episode_sidecar(root, episode)
        if meta is None or "initial_state" not in arrays:
            return None
        return _render(root, dataset_sidecar, episode, key, rows, out, fps, features[key], meta, arrays)

    return regenerate


def _render(
    root: Path,
    dataset_sidecar: dict[str, Any],
    episode: int,
    key: str,
    rows: pa.Table,
    out: Path,
    fps: int,
    feature: dict[str, Any],
    meta: dict[str, Any],
    arrays: dict[str, np.ndarray],
) -> str:
    from hilrec.sim.episode import Push
    from hilrec.sim.provenance import scene_from_sidecar
    from hilrec.sim.replay import run_actions
    from hilrec.sim.twin import Twin

    where = f"{root} episode {episode}"
    camera = key.removeprefix(IMAGE_PREFIX)
    height, width = int(feature["shape"][0]), int(feature["shape"][1])
    actions = column_to_numpy(rows.column(ACTION_KEY)).astype(np.float32)
    states = column_to_numpy(rows.column(STATE_KEY)).astype(np.float32)
    pushes = [Push.from_dict(p, where) for p in (meta.get("sim") or {}).get("disturbances") or []]
    codec = ENCODER_OF_CODEC.get(str((feature.get("info") or {}).get("video.codec")), "libsvtav1")
    scene = scene_from_sidecar(dataset_sidecar, root)
    with Twin(fps=fps, cameras=(camera,), image_size=(height, width), scene=scene) as twin:
        encoder = StreamEncoder(out, fps=fps, height=height, width=width, settings=VideoSettings(codec=codec))

        def render(frame: int, observation: np.ndarray) -> None:
            if not np.array_equal(observation, states[frame]):
                raise ReplayError(
                    f"{where}: the replay leaves the recorded states at frame {frame}; "
                    "its video is not drawn from states the recording did not have"
                )
            encoder.encode(twin.render(camera))

        try:
            run_actions(twin, arrays["initial_state"], actions, pushes, on_observe=render)
        except BaseException:
            encoder.abort()
            raise
        frames = encoder.close()
    seed = meta.get("seed", (meta.get("sim") or {}).get("seed"))
    return f"re-rendered on the twin from its start state and {frames} recorded actions (seed {seed})"
