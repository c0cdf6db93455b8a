"""Our task scene around the packaged SO-101: a table, a cube placed from a seed, a bin, two cameras.

The arm's MJCF is loaded from the installed package (see :mod:`hilrec.sim.model`) and edited in
memory with ``mujoco.MjSpec``; the scene objects are ours. Two variants of the same scene share
one joint layout, so a state from one is a state of the other:

- ``visual="none"`` is the physics model. The arm's mesh geoms are removed: the visual ones do
  nothing to dynamics (``contype=0``, and every link has an explicit ``<inertial>``) and the
  collision meshes are replaced, for the only contact that matters in this task, by the jaw pads
  the package ships. Only the pads, the cube, the bin and the table collide, all as boxes, so a
  step costs microseconds and a grasp is a clean box-box contact.
- ``visual="fast"`` / ``"full"`` are for pixels: the arm's visual meshes, either simplified in
  memory (:mod:`hilrec.sim.lowpoly`) or as shipped. They are never stepped.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Literal

import mujoco
import numpy as np

from hilrec.daemon.errors import ConfigError, SimError
from hilrec.sim.model import locate_model

Visual = Literal["none", "fast", "full"]
CAMERA_NAMES: tuple[str, ...] = ("front", "wrist")


def camera_problem(cameras: tuple[str, ...], names: tuple[str, ...] = CAMERA_NAMES) -> str | None:
    """Why ``cameras`` cannot be rendered from a scene whose cameras are ``names``, or None
    (record --sim and eval ask)."""
    unknown = [c for c in cameras if c not in names]
    if unknown:
        return f"unknown camera {', '.join(unknown)} (scene cameras: {', '.join(names)})"
    if len(set(cameras)) != len(cameras):
        return f"a camera is listed twice: {', '.join(cameras)}"
    return None


# In front of the arm and off to its left, so the arm, the cube and the bin all show.
FRONT_CAMERA_POS = np.array([0.52, 0.32, 0.42])
FRONT_CAMERA_TARGET = np.array([0.12, -0.05, 0.05])
CUBE_BODY = "cube"
CUBE_GEOM = "cube"
TABLE_GEOM = "table"
GRIPPER_BODY = "gripper"  # the wrist_roll link, which carries the fixed jaw
MOVING_JAW_BODY = "moving_jaw_so101_v1"
JAW_PADS = ("fixed_jaw_pad", "moving_jaw_pad")
GRIPPER_SITE = "gripperframe"
BIN_GEOM_PREFIX = "bin_"
ARM_BODIES = ("shoulder", "upper_arm", "lower_arm", "wrist", GRIPPER_BODY, MOVING_JAW_BODY)
# The physics step wherever it divides the frame (25 fps: 8 steps); see hilrec.sim.twin.timestep_for.
DEFAULT_TIMESTEP = 0.005


@dataclass(frozen=True, kw_only=True)
class SceneConfig:
    """Physics and layout of the pick-and-place scene (metres, kilograms, seconds, radians)."""

    # Physics step (s). None: the twin picks one for its fps (hilrec.sim.twin.timestep_for: 5 ms
    # where that divides the frame, else the largest step below it that does); a twin's own
    # ``scene`` always carries the step it runs at.
    timestep: float | None = None
    cube_half_size: float = 0.015
    cube_mass: float = 0.03
    cube_friction: float = 1.2
    cube_x_range: tuple[float, float] = (0.15, 0.25)
    cube_y_range: tuple[float, float] = (-0.04, 0.12)
    cube_yaw_range: tuple[float, float] = (-math.pi / 4, math.pi / 4)
    bin_center: tuple[float, float] = (0.17, -0.16)
    bin_inner_half: tuple[float, float] = (0.055, 0.055)
    bin_wall_height: float = 0.035
    bin_wall_thickness: float = 0.006
    table_half: tuple[float, float] = (0.42, 0.40)
    table_center: tuple[float, float] = (0.16, 0.0)
    settle_speed: float = 0.01  # m/s: below this the cube counts as resting
    # The arm's pose at the start of every episode, in LeRobot units (deg..., gripper 0-100).
    arm_start: tuple[float, ...] = (0.0, -60.0, 60.0, 70.0, 0.0, 10.0)

    def validate(self) -> None:
        if self.timestep is not None and not 0.0005 <= self.timestep <= 0.02:
            raise ConfigError("timestep", f"{self.timestep} s is outside [0.0005, 0.02]")
        if not 0.005 <= self.cube_half_size <= 0.022:
            raise ConfigError("cube_half_size", "the jaws open to about 45 mm: use 0.005..0.022 m")
        for key in ("cube_x_range", "cube_y_range", "cube_yaw_range"):
            low, high = getattr(self, key)
            if low > high:
                raise ConfigError(key, f"low {low} is above high {high}")
        if self.cube_mass <= 0 or self.cube_friction <= 0:
            raise ConfigError("cube_mass", "mass and friction must be positive")
        if len(self.arm_start) != 6 or not all(math.isfinite(v) for v in self.arm_start):
            raise ConfigError("arm_start", f"six finite joint values, got {self.arm_start}")

    def __post_init__(self) -> None:
        self.validate()

    @property
    def arms(self) -> int:
        return 1

    @property
    def arm_prefixes(self) -> tuple[str, ...]:
        """The name prefix of each arm's joints, bodies and cameras in the model."""
        return ("",)

    @property
    def camera_names(self) -> tuple[str, ...]:
        return CAMERA_NAMES

    def build_spec(self, visual: Visual = "none") -> mujoco.MjSpec:
        return _one_arm_spec(self, visual)


@dataclass(frozen=True, kw_only=True)
class CubePlacement:
    """Where the seed put the cube: on the table, at (x, y), turned by ``yaw`` about z."""

    x: float
    y: float
    yaw: float
    z: float

    @property
    def position(self) -> np.ndarray:
        return np.array([self.x, self.y, self.z])

    @property
    def quaternion(self) -> np.ndarray:
        return np.array([math.cos(self.yaw / 2), 0.0, 0.0, math.sin(self.yaw / 2)])

    def to_dict(self) -> dict[str, float]:
        return {"x": self.x, "y": self.y, "z": self.z, "yaw": self.yaw}


def place_cube(seed: int, config: SceneConfig) -> CubePlacement:
    """The cube placement a seed makes; pure, so an operator can plan without a simulator."""
    if seed < 0:
        raise SimError(f"seed {seed}: seeds are non-negative integers")
    rng = np.random.default_rng(seed)
    x = float(rng.uniform(*config.cube_x_range))
    y = float(rng.uniform(*config.cube_y_range))
    yaw = float(rng.uniform(*config.cube_yaw_range))
    return CubePlacement(x=x, y=y, yaw=yaw, z=config.cube_half_size)


@dataclass(frozen=True, kw_only=True)
class BinCheck:
    """The success criterion evaluated on a cube pose and speed."""

    inside: bool
    below_rim: bool
    resting: bool

    @property
    def success(self) -> bool:
        return self.inside and self.below_rim and self.resting


SUCCESS_CRITERION = (
    "cube centre strictly within the bin's inner walls in x and y (inset by the "
    "cube half-size), below the rim, and moving slower than settle_speed m/s, "
    "at the end of the episode's last frame"
)


def check_in_bin(position: np.ndarray, speed: float, config: SceneConfig) -> BinCheck:
    cx, cy = config.bin_center
    hx, hy = config.bin_inner_half
    margin = config.cube_half_size
    inside = abs(position[0] - cx) < hx - margin and abs(position[1] - cy) < hy - margin
    below = position[2] < config.bin_wall_height
    return BinCheck(inside=bool(inside), below_rim=bool(below), resting=bool(speed < config.settle_speed))


@functools.lru_cache(maxsize=8)
def compile_scene(config: SceneConfig, visual: Visual = "none") -> mujoco.MjModel:
    """The compiled scene (cached: callers must treat it as read-only and copy to change it)."""
    spec = build_spec(config, visual)
    try:
        return spec.compile()
    except ValueError as exc:
        raise SimError(f"the scene ({visual=}) does not compile: {exc}") from exc


@functools.lru_cache(maxsize=8)
def scene_xml(config: SceneConfig) -> str:
    """The physics scene as MJCF text: what gets hashed into a dataset's provenance."""
    return build_spec(config, "none").to_xml()


def build_spec(config: SceneConfig, visual: Visual = "none") -> mujoco.MjSpec:
    """The scene ``config`` describes (a two-arm scene builds itself: ``config.build_spec``)."""
    return config.build_spec(visual)


def _one_arm_spec(config: SceneConfig, visual: Visual) -> mujoco.MjSpec:
    spec = arm_spec(visual)
    spec.modelname = "hilrec_so101_pick_place"
    set_physics(spec, config)
    add_table_cube_bin(spec, config)
    add_front_camera(spec, FRONT_CAMERA_POS, FRONT_CAMERA_TARGET)
    add_wrist_camera(spec)
    add_lights(spec)
    return spec


def arm_spec(visual: Visual) -> mujoco.MjSpec:
    """The packaged SO-101 as this scene uses it: meshes per ``visual``, jaw pads colliding."""
    spec = mujoco.MjSpec.from_file(str(locate_model().xml))
    _strip_arm_meshes(spec, visual)
    _enable_jaw_pads(spec)
    return spec


def _strip_arm_meshes(spec: mujoco.MjSpec, visual: Visual) -> None:
    keep_visual = visual != "none"
    for geom in list(spec.geoms):
        if geom.type != mujoco.mjtGeom.mjGEOM_MESH:
            continue
        is_visual = geom.contype == 0 and geom.conaffinity == 0 and geom.group == 2
        if not (keep_visual and is_visual):
            spec.delete(geom)
    if not keep_visual:
        for mesh in list(spec.meshes):
            spec.delete(mesh)
    elif visual == "fast":
        from hilrec.sim.lowpoly import simplify_meshes

        simplify_meshes(spec, locate_model())


def set_physics(spec: mujoco.MjSpec, config: SceneConfig) -> None:
    opt = spec.option
    # A scene without a step (e.g. for its joint ranges alone) compiles at the default one.
    opt.timestep = DEFAULT_TIMESTEP if config.timestep is None else config.timestep
    # implicitfast keeps the stiff position servos stable at a 5 ms step; elliptic cones with a
    # raised impratio make a pinched cube stick instead of creeping out of the jaws.
    opt.integrator = mujoco.mjtIntegrator.mjINT_IMPLICITFAST
    opt.cone = mujoco.mjtCone.mjCONE_ELLIPTIC
    opt.impratio = 10.0
    spec.visual.global_.offwidth = 1920
    spec.visual.global_.offheight = 1080
    spec.visual.quality.offsamples = 0
    spec.visual.quality.shadowsize = 0


def _enable_jaw_pads(spec: mujoco.MjSpec) -> None:
    for name in JAW_PADS:
        pad = spec.geom(name)
        if pad is None:
            raise SimError(f"the packaged SO-101 model has no jaw pad geom '{name}'")
        pad.contype = 1
        pad.conaffinity = 1
        pad.condim = 4  # torsional friction where the jaws pinch; the cube's other contacts stay 3
        pad.friction = [1.2, 0.01, 0.0001]


def add_table_cube_bin(spec: mujoco.MjSpec, config: SceneConfig) -> None:
    box = mujoco.mjtGeom.mjGEOM_BOX
    world = spec.worldbody
    tx, ty = config.table_center
    world.add_geom(
        name=TABLE_GEOM,
        type=box,
        size=[*config.table_half, 0.01],
        pos=[tx, ty, -0.01],
        rgba=[0.72, 0.60, 0.45, 1],
    )
    cube = world.add_body(name=CUBE_BODY, pos=[0.25, 0.0, config.cube_half_size])
    cube.add_freejoint(name=CUBE_BODY)
    cube.add_geom(
        name=CUBE_GEOM,
        type=box,
        size=[config.cube_half_size] * 3,
        mass=config.cube_mass,
        condim=3,
        friction=[config.cube_friction, 0.01, 0.0001],
        rgba=[0.85, 0.15, 0.12, 1],
    )
    cx, cy = config.bin_center
    hx, hy = config.bin_inner_half
    wall, height = config.bin_wall_thickness, config.bin_wall_height
    colour = [0.25, 0.35, 0.55, 1]
    world.add_geom(
        name=BIN_GEOM_PREFIX + "floor",
        type=box,
        pos=[cx, cy, wall / 2],
        size=[hx + wall, hy + wall, wall / 2],
        rgba=colour,
    )
    walls = {
        "wall_xpos": ([cx + hx + wall / 2, cy], [wall / 2, hy + wall]),
        "wall_xneg": ([cx - hx - wall / 2, cy], [wall / 2, hy + wall]),
        "wall_ypos": ([cx, cy + hy + wall / 2], [hx, wall / 2]),
        "wall_yneg": ([cx, cy - hy - wall / 2], [hx, wall / 2]),
    }
    for name, (xy, half) in walls.items():
        world.add_geom(
            name=BIN_GEOM_PREFIX + name,
            type=box,
            pos=[*xy, height / 2],
            size=[*half, height / 2],
            rgba=colour,
        )


def look_at_quat(position: np.ndarray, target: np.ndarray, up: np.ndarray) -> np.ndarray:
    """Quaternion of a MuJoCo camera at ``position`` looking at ``target`` (camera looks down -z)."""
    forward = target - position
    z_axis = -forward / np.linalg.norm(forward)
    x_axis = np.cross(up, z_axis)
    x_axis /= np.linalg.norm(x_axis)
    y_axis = np.cross(z_axis, x_axis)
    quat = np.zeros(4)
    mujoco.mju_mat2Quat(quat, np.column_stack([x_axis, y_axis, z_axis]).ravel())
    return quat


def add_front_camera(spec: mujoco.MjSpec, position: np.ndarray, target: np.ndarray) -> None:
    spec.worldbody.add_camera(
        name="front",
        pos=position,
        fovy=50,
        quat=look_at_quat(position, target, np.array([0.0, 0.0, 1.0])),
    )


def add_wrist_camera(spec: mujoco.MjSpec) -> None:
    # The wrist camera sits on the outer side of the fixed jaw, looking along the jaws at the
    # grasp zone with the jaw at the bottom of the image, as the usual SO-101 wrist mount does.
    site = spec.site(GRIPPER_SITE)
    site_rot = np.zeros(9)
    mujoco.mju_quat2Mat(site_rot, np.asarray(site.quat, dtype=float))
    rot = site_rot.reshape(3, 3)
    origin = np.asarray(site.pos, dtype=float)
    cam_pos = origin + rot @ np.array([-0.04, 0.0, -0.06])
    target = origin + rot @ np.array([0.04, 0.0, 0.01])
    spec.body(GRIPPER_BODY).add_camera(
        name="wrist",
        pos=cam_pos,
        fovy=70,
        quat=look_at_quat(cam_pos, target, rot @ np.array([0.0, 0.0, -1.0])),
    )


def add_lights(spec: mujoco.MjSpec) -> None:
    spec.worldbody.add_light(
        name="sun",
        pos=[0.2, 0.0, 1.5],
        dir=[0, 0, -1],
        castshadow=False,
        diffuse=[0.7, 0.7, 0.7],
        specular=[0.1, 0.1, 0.1],
    )
    spec.visual.headlight.ambient = [0.35, 0.35, 0.35]
    spec.visual.headlight.diffuse = [0.4, 0.4, 0.4]
