"""Deterministic synthetic SO-101 frames for the dataset tests.

Joint values are smooth curves in LeRobot units (degrees for the body joints, 0..100 for the
gripper) that are *not* round numbers, so a float32 that is silently widened, narrowed or
re-computed shows up in a bit-exact comparison. Camera frames are smooth colour gradients that move
from frame to frame: a lossy codec keeps them close to the original (so a decoded-frame comparison
means something), while a frame from the wrong timestamp or the wrong episode differs clearly.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from hilrec.daemon.so101 import ACTION_KEY, IMAGE_PREFIX, ROBOT_TYPE, STATE_KEY, so101_features

if TYPE_CHECKING:
    from hilrec.daemon.dataset.writer.dataset_writer import DatasetWriter

FPS = 25
IMAGE_SIZE = (96, 128)  # (height, width): small keeps encoding fast, even sides suit yuv420p
TASKS = ("pick up the cube", "put the cube in the bowl")

# Per joint: centre, amplitude, frequency (Hz), phase. Degrees; the gripper (last) in 0..100.
_JOINT_CURVES = np.array(
    [
        [3.0, 41.7, 0.31, 0.0],
        [-12.5, 33.3, 0.23, 0.7],
        [18.1, 27.9, 0.41, 1.3],
        [-7.3, 22.2, 0.37, 2.1],
        [1.9, 63.1, 0.19, 2.9],
        [37.0, 29.7, 0.29, 0.4],
    ]
)


def features(cameras: Mapping[str, tuple[int, int]] | None = None) -> dict[str, dict[str, Any]]:
    """The user features of an SO-101 recording with the given cameras (name -> (H, W))."""
    return so101_features(cameras or {})


def joint_positions(episode: int, frame_index: np.ndarray | int, *, lag: float = 0.0) -> np.ndarray:
    """float32 ``(..., 6)`` joint positions of ``episode`` at ``frame_index`` (optionally lagged)."""
    t = (np.asarray(frame_index, dtype=np.float64)[..., None] - lag) / FPS
    centre, amplitude, freq, phase = _JOINT_CURVES.T
    values = centre + amplitude * np.sin(2 * np.pi * freq * t + phase + 0.5 * episode)
    return values.astype(np.float32)


def camera_image(
    episode: int, frame_index: int, camera: int = 0, size: tuple[int, int] = IMAGE_SIZE
) -> np.ndarray:
    """uint8 ``(H, W, 3)``: a diagonal red ramp drifting right, a vertical green ramp, flat blue."""
    height, width = size
    y = np.arange(height, dtype=np.float64)[:, None]
    x = np.arange(width, dtype=np.float64)[None, :]
    shift = 3.0 * frame_index + 17.0 * episode + 29.0 * camera
    red = 40 + 170 * (0.5 + 0.5 * np.sin(2 * np.pi * (x + 0.5 * y + shift) / (1.5 * width)))
    green = 30 + 190 * (y / max(height - 1, 1)) * (0.8 + 0.2 * np.cos(frame_index / 7.0))
    blue = np.full((height, width), 60 + (37 * episode + 5 * frame_index + 50 * camera) % 140, float)
    image = np.stack(np.broadcast_arrays(red, green, blue), axis=-1)
    return np.clip(np.rint(image), 0, 255).astype(np.uint8)


def episode_frames(
    episode: int,
    num_frames: int,
    *,
    cameras: Sequence[str] = (),
    image_size: tuple[int, int] = IMAGE_SIZE,
    task: str | None = None,
) -> list[dict[str, Any]]:
    """Frames of one episode as a writer's ``add_frame`` takes them.

    The follower's state is the leader's action one frame later (it follows with a lag), so action
    and state differ in every row.
    """
    task = task or TASKS[episode % len(TASKS)]
    indices = np.arange(num_frames)
    actions = joint_positions(episode, indices)
    states = joint_positions(episode, indices, lag=1.0)
    frames: list[dict[str, Any]] = []
    for i in range(num_frames):
        frame: dict[str, Any] = {ACTION_KEY: actions[i].copy(), STATE_KEY: states[i].copy(), "task": task}
        for c, name in enumerate(cameras):
            frame[IMAGE_PREFIX + name] = camera_image(episode, i, c, image_size)
        frames.append(frame)
    return frames


def write_dataset(
    create_sink: Callable[..., Any],
    root: Path,
    lengths: Sequence[int],
    *,
    cameras: Sequence[str] = (),
    image_size: tuple[int, int] = IMAGE_SIZE,
    **create_kwargs: Any,
) -> list[list[dict[str, Any]]]:
    """Write one episode per entry of ``lengths`` through ``create_sink`` (e.g.
    ``LeRobotSink.create``) and return the frames written, per episode."""
    feats = features(dict.fromkeys(cameras, image_size))
    written: list[list[dict[str, Any]]] = []
    with create_sink(root, fps=FPS, features=feats, robot_type=ROBOT_TYPE, **create_kwargs) as sink:
        for episode, length in enumerate(lengths):
            frames = episode_frames(episode, length, cameras=cameras, image_size=image_size)
            for frame in frames:
                sink.add_frame(frame)
            sink.save_episode(sidecar={"seed": episode})
            written.append(frames)
    return written


def stacked(frames: Sequence[Mapping[str, Any]], key: str) -> np.ndarray:
    return np.stack([np.asarray(f[key]) for f in frames])


def front_camera_writer(root: Path, size: tuple[int, int], **options: Any) -> DatasetWriter:
    """A new dataset at ``root`` of SO-101 rows and one ``front`` camera of ``size`` (H, W) at
    25 fps, encoded with libx264 (fast): the one the crash and repair tests take apart."""
    # Imported here: the compat-latest root imports this module for its frames alone.
    from hilrec.daemon.dataset.writer.dataset_writer import DatasetWriter

    return DatasetWriter.create(
        root,
        fps=FPS,
        features=so101_features({"front": size}),
        robot_type="so_follower",
        video_codec="libx264",
        **options,
    )
