"""The two-arm scene: two packaged SO-101s facing each other across one table, a cube, a bin.

The task is a handover through the table: the cube starts within the left arm's reach only, the
bin is within the right arm's only. The left arm places the cube on the handover spot between
them; the right arm picks it up there and places it in the bin. (A hand-to-hand handover in the
air would need both grippers to hold the cube at once, which the scripted operator's top-down
grasps cannot plan; passing through the table keeps every grasp one it already makes.)

Both arms are the packaged MJCF, edited as the one-arm scene edits it (:func:`arm_spec`) and
attached to our world with ``MjSpec.attach`` under the prefixes ``left_`` and ``right_``, so
every joint, actuator, body, geom and wrist camera carries its arm's name, as LeRobot's
``bi_so_follower`` prefixes every motor and camera. Nothing of the model is copied.

The left arm stands at ``x = -arm_spacing / 2`` facing +x, the right arm at ``+arm_spacing / 2``
facing -x; the front camera looks from -y, so the left arm is on the left of its image. Every
position in the config is in world coordinates; :class:`ArmFrame` maps them into an arm's own.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import mujoco
import numpy as np

from hilrec.daemon.errors import ConfigError
from hilrec.daemon.so101 import arm_prefixes
from hilrec.sim.scene import (
    CubePlacement,
    SceneConfig,
    Visual,
    add_front_camera,
    add_lights,
    add_table_cube_bin,
    add_wrist_camera,
    arm_spec,
    set_physics,
)

BIMANUAL_CAMERA_NAMES: tuple[str, ...] = ("front", "left_wrist", "right_wrist")
FRONT_CAMERA_POS = np.array([0.0, -0.62, 0.48])
FRONT_CAMERA_TARGET = np.array([0.0, 0.04, 0.03])
BIMANUAL_TASK = "Hand the red cube from the left arm to the right arm and place it in the blue bin."


@dataclass(frozen=True, kw_only=True)
class ArmFrame:
    """Where an arm's base stands in the world: at (x, y), turned by ``yaw`` about z."""

    prefix: str
    x: float
    y: float
    yaw: float

    def to_local(self, point: np.ndarray) -> np.ndarray:
        """A world point (x, y, z) in this arm's base frame."""
        c, s = math.cos(self.yaw), math.sin(self.yaw)
        dx, dy = float(point[0]) - self.x, float(point[1]) - self.y
        return np.array([c * dx + s * dy, -s * dx + c * dy, float(point[2])])

    def local_placement(self, cube: CubePlacement) -> CubePlacement:
        local = self.to_local(cube.position)
        return CubePlacement(x=float(local[0]), y=float(local[1]), yaw=cube.yaw - self.yaw, z=cube.z)

    def quaternion(self) -> list[float]:
        return [math.cos(self.yaw / 2), 0.0, 0.0, math.sin(self.yaw / 2)]


@dataclass(frozen=True, kw_only=True)
class BimanualSceneConfig(SceneConfig):
    """The handover scene (world coordinates; the inherited fields mean what they mean for one
    arm: the cube and bin sizes, the physics, and each arm's start pose in its own units)."""

    arm_spacing: float = 0.50  # m between the two bases, along x
    handover: tuple[float, float] = (0.0, 0.0)  # where the left arm sets the cube down
    cube_x_range: tuple[float, float] = (-0.10, -0.04)
    cube_y_range: tuple[float, float] = (-0.04, 0.12)
    bin_center: tuple[float, float] = (0.08, 0.16)
    table_half: tuple[float, float] = (0.45, 0.34)
    table_center: tuple[float, float] = (0.0, 0.04)

    def validate(self) -> None:
        super().validate()
        if not 0.30 <= self.arm_spacing <= 0.60:
            raise ConfigError("arm_spacing", f"{self.arm_spacing} m: the arms reach ~0.3 m, use 0.30..0.60")

    @property
    def arms(self) -> int:
        return 2

    @property
    def arm_prefixes(self) -> tuple[str, ...]:
        return arm_prefixes(2)

    @property
    def camera_names(self) -> tuple[str, ...]:
        return BIMANUAL_CAMERA_NAMES

    @property
    def arm_frames(self) -> tuple[ArmFrame, ...]:
        left, right = self.arm_prefixes
        half = self.arm_spacing / 2
        return (
            ArmFrame(prefix=left, x=-half, y=0.0, yaw=0.0),
            ArmFrame(prefix=right, x=half, y=0.0, yaw=math.pi),
        )

    def handover_placement(self) -> CubePlacement:
        x, y = self.handover
        return CubePlacement(x=x, y=y, yaw=0.0, z=self.cube_half_size)

    def build_spec(self, visual: Visual = "none") -> mujoco.MjSpec:
        spec = mujoco.MjSpec()
        spec.modelname = "hilrec_so101_bimanual_handover"
        set_physics(spec, self)
        for frame in self.arm_frames:
            arm = arm_spec(visual)
            add_wrist_camera(arm)
            mount = spec.worldbody.add_frame(pos=[frame.x, frame.y, 0.0], quat=frame.quaternion())
            spec.attach(arm, frame=mount, prefix=frame.prefix)
        add_table_cube_bin(spec, self)
        add_front_camera(spec, FRONT_CAMERA_POS, FRONT_CAMERA_TARGET)
        add_lights(spec)
        return spec
