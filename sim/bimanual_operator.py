"""The scripted two-arm operator of the handover scene: two people on two leader arms.

Each arm is played by a one-arm :class:`~hilrec.sim.operator.ScriptedOperator` planning in its
own base frame (:class:`~hilrec.sim.bimanual_scene.ArmFrame`), on the one-arm scene's kinematics:
the arm is the same packaged SO-101, so a pose solved there is the pose of the attached arm.

- The left arm picks the cube where the seed put it and sets it down on the handover spot (its
  "bin" is the spot on the table, released just above it).
- The right arm holds its start pose until the left arm is home again, then picks the cube up
  from where it actually came to rest (its plan is re-made from the cube it sees, as the
  one-arm operator re-plans a knocked cube) and places it in the bin.

Frames are whole: every frame hands out twelve leader positions, left arm first, in LeRobot
units, the bi_so_leader's action.
"""

from __future__ import annotations

import dataclasses

import mujoco
import numpy as np

from hilrec.daemon.errors import SimError
from hilrec.sim.bimanual_scene import BimanualSceneConfig
from hilrec.sim.episode import LeaderScript
from hilrec.sim.operator import OperatorConfig, ScriptedOperator
from hilrec.sim.scene import CubePlacement, SceneConfig
from hilrec.sim.twin import EpisodeStart
from hilrec.sim.units import UnitsMap, default_units_map

# m above the table the left arm lets go of the cube on the handover spot (its bottom face).
HANDOVER_RELEASE = 0.003


def one_arm_scene(scene: BimanualSceneConfig, bin_center: np.ndarray) -> SceneConfig:
    """The one-arm scene an arm plans in: ``scene``'s physics and sizes, its target (the bin,
    or the handover spot) at ``bin_center`` in the arm's frame."""
    shared = {f.name: getattr(scene, f.name) for f in dataclasses.fields(SceneConfig)}
    shared["bin_center"] = (float(bin_center[0]), float(bin_center[1]))
    return SceneConfig(**shared)


class BimanualOperator:
    """Both leader arms for one seed: ``reset(start)`` plans, ``act(i, obs)`` plays frame i."""

    def __init__(
        self,
        seed: int,
        *,
        fps: int = 25,
        scene: BimanualSceneConfig | None = None,
        config: OperatorConfig | None = None,
        units: UnitsMap | None = None,
    ) -> None:
        self.seed = seed
        self.fps = fps
        self.scene = scene or BimanualSceneConfig()
        self.config = config or OperatorConfig()
        self.units = units or default_units_map()
        self._left_frame, self._right_frame = self.scene.arm_frames
        handover = np.array([*self.scene.handover, 0.0])
        bin_world = np.array([*self.scene.bin_center, 0.0])
        # The spot has no bin floor under it: let go just above the table instead.
        on_table = HANDOVER_RELEASE - self.scene.bin_wall_thickness
        left_config = dataclasses.replace(self.config, release_above_floor=on_table)
        self._left = ScriptedOperator(
            seed,
            fps=fps,
            scene=one_arm_scene(self.scene, self._left_frame.to_local(handover)),
            config=left_config,
            units=self.units,
        )
        self._right = ScriptedOperator(
            seed,
            fps=fps,
            scene=one_arm_scene(self.scene, self._right_frame.to_local(bin_world)),
            config=self.config,
            units=self.units,
        )
        self._wait = 0  # frames the right arm holds before its plan starts
        self._right_start: np.ndarray = np.zeros(0, dtype=np.float32)
        self._planned = False

    # --- public -------------------------------------------------------------------------------

    def reset(self, start: EpisodeStart | None = None) -> None:
        """Plan both arms from a twin's EpisodeStart (world cube, twelve start units), or from
        the seed's placement and the scene's start pose."""
        from hilrec.sim.scene import place_cube

        units: np.ndarray
        if start is None:
            cube = place_cube(self.seed, self.scene)
            units = np.tile(np.asarray(self.scene.arm_start, dtype=np.float32), 2)
        else:
            cube, units = start.cube, np.asarray(start.arm_units, dtype=np.float32)
        if units.shape != (12,):
            raise SimError(f"a two-arm start has 12 joint values, got shape {units.shape}")
        left_units, right_units = units[:6], units[6:]
        self._left.reset(self._arm_start(self._left_frame.local_placement(cube), left_units))
        # The right arm moves once the left arm has set the cube down and is back home.
        self._wait = self._left.phase_starts["settle"]
        self._right_start = right_units.copy()
        handover = self._right_frame.local_placement(self.scene.handover_placement())
        self._right.reset(self._arm_start(handover, right_units))
        self._planned = True

    @property
    def num_frames(self) -> int:
        self._require_plan()
        return max(self._left.num_frames, self._wait + self._right.num_frames)

    @property
    def phase_starts(self) -> dict[str, int]:
        left = {f"left_{k}": v for k, v in self._left.phase_starts.items()}
        right = {f"right_{k}": v + self._wait for k, v in self._right.phase_starts.items()}
        return left | right

    @property
    def replans(self) -> list[int]:
        return sorted([*self._left.replans, *(f + self._wait for f in self._right.replans)])

    def act(self, frame_index: int, observation: np.ndarray | None = None) -> np.ndarray:
        """Both leaders' positions (float32 (12,), LeRobot units, left first) at ``frame_index``."""
        self._require_plan()
        left = self._left.act(frame_index)
        if frame_index < self._wait:
            right = self._right_start.copy()
        else:
            right = self._right.act(frame_index - self._wait)
        return np.concatenate([left, right])

    def leader_path(self) -> np.ndarray:
        return np.stack([self.act(i) for i in range(self.num_frames)])

    def watching(self, frame_index: int) -> bool:
        """Whether :meth:`watch_cube` could re-plan an arm at ``frame_index``."""
        self._require_plan()
        return self._left.watching(frame_index) or self._right.watching(frame_index - self._wait)

    def watch_cube(
        self, frame_index: int, position: np.ndarray, quaternion: np.ndarray, speed: float = 0.0
    ) -> bool:
        """The arm whose grasp is next looks at the cube (world pose) and re-plans if it is not
        where its plan has it; returns whether a plan changed."""
        self._require_plan()
        for frame, operator, arm in (
            (frame_index, self._left, self._left_frame),
            (frame_index - self._wait, self._right, self._right_frame),
        ):
            if operator.watching(frame):
                local_position = arm.to_local(np.asarray(position, dtype=float))
                local_quaternion = _turned(np.asarray(quaternion, dtype=float), -arm.yaw)
                return operator.watch_cube(frame, local_position, local_quaternion, speed)
        return False

    # --- internals ----------------------------------------------------------------------------

    def _require_plan(self) -> None:
        if not self._planned:
            raise SimError("BimanualOperator.reset() must run before act()/leader_path()")

    def _arm_start(self, local_cube: CubePlacement, units: np.ndarray) -> EpisodeStart:
        """What one arm's operator plans from: the cube in that arm's frame, its start units."""
        return EpisodeStart(seed=self.seed, cube=local_cube, arm_units=units, state=np.zeros(0))


def _turned(quaternion: np.ndarray, yaw: float) -> np.ndarray:
    """``quaternion`` turned by ``yaw`` about the world z axis."""
    turn = np.array([np.cos(yaw / 2), 0.0, 0.0, np.sin(yaw / 2)])
    out = np.zeros(4)
    mujoco.mju_mulQuat(out, turn, quaternion)
    return out


def make_operator(
    seed: int,
    *,
    fps: int = 25,
    scene: SceneConfig | None = None,
    config: OperatorConfig | None = None,
    units: UnitsMap | None = None,
) -> LeaderScript:
    """The scripted operator of ``scene``: one arm's, or both arms' in the handover scene."""
    if isinstance(scene, BimanualSceneConfig):
        return BimanualOperator(seed, fps=fps, scene=scene, config=config, units=units)
    return ScriptedOperator(seed, fps=fps, scene=scene, config=config, units=units)
