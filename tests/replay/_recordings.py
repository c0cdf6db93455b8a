"""Hardware-like recordings for the replay-check tests, made on the MuJoCo twin.

The follower is a twin (the emulated arm's follower is a twin too); the leader is a smooth path of
random waypoints that keeps the jaws off the table. The recorder follows hilrec's loop contract:
read the follower, read the leader, command, step a frame, write the row. Faults are injected where
a real setup would have them:

- ``latency_frames``: the follower receives each leader command that many frames late, while the
  row records the leader reading of its own frame (a slow bus or a queue between the two arms);
- ``obs_shift_frames``: the ``observation.state`` column is written that many frames late;
- ``frozen``: from a frame on, one servo ignores its goal and holds where it is (it stopped
  responding to commands), while its reading stays truthful.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from hilrec.daemon.so101 import ACTION_KEY, JOINT_NAMES, ROBOT_TYPE, STATE_KEY, so101_features

FPS = 25
TASK = "move the arm"
# Centre and half-span of the waypoints, in LeRobot units: well inside the ranges, jaws above the
# table (checked with the twin's contacts when this was written).
_CENTRE = np.array([0.0, -60.0, 30.0, 40.0, 0.0, 40.0])
_SPAN = np.array([35.0, 25.0, 25.0, 20.0, 45.0, 35.0])
_SEGMENT_S = 1.2


@dataclass(frozen=True)
class Frozen:
    joint: str
    from_frame: int


@dataclass(frozen=True)
class RecordingSpec:
    seed: int = 0
    frames: int = 250
    latency_frames: int = 0
    obs_shift_frames: int = 0
    frozen: Frozen | None = None


@dataclass(frozen=True)
class Episode:
    spec: RecordingSpec
    action: np.ndarray  # float32 (n, 6), degrees / 0..100
    state: np.ndarray  # float32 (n, 6)


def leader_path(seed: int, frames: int, fps: int = FPS) -> np.ndarray:
    """float32 ``(frames, 6)``: minimum-jerk moves between random waypoints."""
    rng = np.random.default_rng(seed)
    count = int(frames / fps / _SEGMENT_S) + 2
    waypoints = _CENTRE + rng.uniform(-1.0, 1.0, (count, 6)) * _SPAN
    t = np.arange(frames) / fps
    knots = np.arange(count) * _SEGMENT_S
    out = np.empty((frames, 6))
    for i in range(count - 1):
        inside = (t >= knots[i]) & (t <= knots[i + 1])
        s = (t[inside] - knots[i]) / _SEGMENT_S
        s = 10 * s**3 - 15 * s**4 + 6 * s**5
        out[inside] = waypoints[i] + (waypoints[i + 1] - waypoints[i]) * s[:, None]
    return out.astype(np.float32)


def make_twin(fps: int = FPS) -> Any:
    from hilrec.sim.scene import SceneConfig
    from hilrec.sim.twin import Twin

    # The cube is parked out of reach: these recordings are about the arm only.
    scene = replace(SceneConfig(), cube_x_range=(0.55, 0.55), cube_y_range=(0.35, 0.35),
                    cube_yaw_range=(0.0, 0.0))
    return Twin(fps=fps, cameras=(), scene=scene)


def record(spec: RecordingSpec, twin: Any) -> Episode:
    """One episode on ``twin`` as a hardware recorder would have written it."""
    leader = leader_path(spec.seed, spec.frames, twin.fps)
    twin.reset(spec.seed, arm_units=leader[0])
    frozen_index = JOINT_NAMES.index(spec.frozen.joint) if spec.frozen else None
    held: np.ndarray | None = None
    states, actions = [], []
    for t in range(spec.frames):
        state = twin.observe()
        action = leader[t]
        goal = leader[max(0, t - spec.latency_frames)].copy()
        if spec.frozen is not None and t >= spec.frozen.from_frame:
            if held is None:
                held = state.copy()
            goal[frozen_index] = held[frozen_index]
        twin.command(goal)
        twin.step_frame()
        states.append(state)
        actions.append(action)
    state_col = np.array(states, dtype=np.float32)
    if spec.obs_shift_frames:
        k = spec.obs_shift_frames
        state_col = np.concatenate([np.repeat(state_col[:1], k, axis=0), state_col[:-k]])
    return Episode(spec=spec, action=np.array(actions, dtype=np.float32), state=state_col)


def to_m100_100(values: np.ndarray, calibration: dict[str, dict[str, int]]) -> np.ndarray:
    """Degrees body columns -> LeRobot's RANGE_M100_100 under ``calibration`` (gripper kept)."""
    out = np.asarray(values, dtype=np.float64).copy()
    for j, name in enumerate(JOINT_NAMES[:-1]):
        cal = calibration[name]
        ticks_from_mid = out[:, j] * 4095 / 360
        out[:, j] = ticks_from_mid / (cal["range_max"] - cal["range_min"]) * 200
    return out.astype(np.float32)


def write_with_lerobot(root: Path, episodes: Sequence[Episode], *, fps: int = FPS,
                       body_units: str = "degrees",
                       calibration: dict[str, dict[str, int]] | None = None) -> Path:
    """Write with LeRobot's own ``LeRobotDataset`` and nothing beside it (no hilrec metadata)."""
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    features = {k: {**v, "shape": tuple(v["shape"])} for k, v in so101_features().items()}
    dataset = LeRobotDataset.create(repo_id=f"test/{root.name}", fps=fps, features=features,
                                    root=root, robot_type=ROBOT_TYPE, use_videos=False)
    for ep in episodes:
        action, state = ep.action, ep.state
        if body_units == "m100_100":
            assert calibration is not None
            action, state = to_m100_100(action, calibration), to_m100_100(state, calibration)
        for a, s in zip(action, state):
            dataset.add_frame({ACTION_KEY: a, STATE_KEY: s, "task": TASK})
        dataset.save_episode()
    dataset.finalize()
    return root


def add_hilrec_metadata(root: Path, twin: Any) -> None:
    """The dataset sidecar a hilrec recorder writes: units mapping and physics."""
    from hilrec.daemon.dataset.sidecar import update_dataset_sidecar
    from hilrec.sim.units import units_mapping

    update_dataset_sidecar(root, {"units": units_mapping(twin.units),
                                  "physics": twin.physics_info()})


def write_calibration(path: Path, calibration: dict[str, dict[str, int]]) -> Path:
    path.write_text(json.dumps(calibration, indent=4))
    return path
