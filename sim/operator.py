"""A scripted operator that plays the leader arm: reach, grasp, lift, carry, place in the bin.

It acts in LeRobot units, as a person moving a leader arm does: each frame it hands out the
leader's six joint positions, which the recorder sends to the follower (the twin) and records as
``action``. The whole leader path is planned at :meth:`ScriptedOperator.reset` from the cube
placement, so the operator works standalone: given a seed it builds the scene that seed makes
and produces the leader path (:meth:`leader_path`), with no simulator running.

Planning, on a private copy of the scene model (:mod:`hilrec.sim.ik`):

1. choose, among the four jaw directions that straddle the cube's faces, the one needing the
   least wrist roll, and solve top-down IK for the key poses (above the cube, at the cube, lifted,
   above the bin, lowered into the bin);
2. ask each pose's servos for its gravity torque / kp more than the angle wanted (the follower's
   position servos sag under load, and a person on a leader compensates by eye);
3. join the poses with minimum-jerk segments whose durations follow the largest joint move,
   stretched a little by the seed so no two episodes are timed alike.

While recording, :meth:`ScriptedOperator.watch_cube` lets it look at the cube as a person does:
if a push knocks the cube away before the jaws close on it, the rest of the path is re-planned
from where the leader is (the frames already played never change).
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass, field

import mujoco
import numpy as np

from hilrec.daemon.errors import SimError
from hilrec.daemon.so101 import NUM_JOINTS
from hilrec.sim.ik import ArmKinematics, cross3
from hilrec.sim.scene import GRIPPER_SITE, JAW_PADS, CubePlacement, SceneConfig, place_cube
from hilrec.sim.twin import EpisodeStart
from hilrec.sim.units import GRIPPER_INDEX, UnitsMap, default_units_map

DOWN = np.array([0.0, 0.0, -1.0])
TILTED_POSITION_TOLERANCE = 0.008  # m


@dataclass(frozen=True, kw_only=True)
class OperatorConfig:
    """How the scripted operator moves (metres, seconds, LeRobot gripper units)."""

    hover_above: float = 0.05  # gripper point above the cube centre before descending
    fixed_jaw_clearance: float = 0.004  # gap between the fixed pad and the cube on the way down
    lift_height: float = 0.07  # cube centre above the table while carried
    rim_clearance: float = 0.015  # cube bottom above the bin rim while carried over it
    release_above_floor: float = 0.012  # cube bottom above the bin floor when let go
    gripper_open: float = 48.0
    gripper_closed: float = 2.0
    joint_speed: float = 1.6  # rad/s of the fastest joint in a segment
    min_segment: float = 0.35  # s
    grasp_hold: float = 0.45  # s with the jaws closing before lifting
    release_hold: float = 0.4  # s with the jaws opening before retreating
    final_hold: float = 0.8  # s at the end for the cube to come to rest
    timing_jitter: float = 0.12  # segment durations scaled by U(1 - j, 1 + j)
    replan_distance: float = 0.008  # m the cube may be off the plan before it is re-planned
    replan_angle: float = 0.2  # rad, likewise for its turn (modulo a right angle)
    replan_when_slower: float = 0.02  # m/s: a sliding cube is watched until it stops
    max_replans: int = 3


@dataclass(frozen=True, kw_only=True)
class Waypoint:
    name: str
    command: np.ndarray  # (6,) rad, what the leader shows when the segment ends
    duration: float  # s of motion into this waypoint


@dataclass(kw_only=True)
class Plan:
    waypoints: list[Waypoint] = field(default_factory=list)
    path: np.ndarray = field(default_factory=lambda: np.zeros((0, NUM_JOINTS), np.float32))
    phase_starts: dict[str, int] = field(default_factory=dict)
    cube: CubePlacement | None = None  # where the plan expects the cube
    home: np.ndarray | None = None  # rad, where the arm returns at the end


class ScriptedOperator:
    """Leader-arm operator for one seed. ``reset(start)`` plans; ``act(i, obs)`` plays frame i."""

    def __init__(
        self,
        seed: int,
        *,
        fps: int = 25,
        scene: SceneConfig | None = None,
        config: OperatorConfig | None = None,
        units: UnitsMap | None = None,
    ) -> None:
        self.seed = seed
        self.fps = fps
        self.scene = scene or SceneConfig()
        self.config = config or OperatorConfig()
        self.units = units or default_units_map()
        self._kin = shared_kinematics(self.scene)
        self._rng = np.random.default_rng([seed, 0x0BE7])
        self._plan: Plan | None = None
        self.replans: list[int] = []
        self._grasp_point, self._approach_axis, self._jaw_axis = self._gripper_geometry()
        # The solver's starting data is part of what decides a plan (the last bits of the IK):
        # this operator's own, kept across plans as if it had the kinematics to itself.
        self._kin_qpos = self._kin.data.qpos.copy()
        self._roll_axis = self._kin.model.jnt_axis[self._kin.model.joint("wrist_roll").id].copy()
        actuators = [self._kin.model.actuator(i) for i in range(self._kin.model.nu)]
        self._kp = np.array([a.gainprm[0] for a in actuators])

    # --- public -------------------------------------------------------------------------------

    def reset(self, start: EpisodeStart | None = None) -> None:
        """Plan the episode. ``start`` is a twin's EpisodeStart (cube placement and arm units);
        without it the seed's placement and the scene's start pose are used."""
        self._rng = np.random.default_rng([self.seed, 0x0BE7])
        if start is None:
            cube = place_cube(self.seed, self.scene)
            arm_units = np.asarray(self.scene.arm_start, dtype=np.float32)
        else:
            cube = start.cube
            arm_units = np.asarray(start.arm_units, dtype=np.float32)
        self._plan = self._planned(cube, arm_units)
        self.replans = []

    @property
    def num_frames(self) -> int:
        return len(self._require_plan().path)

    @property
    def phase_starts(self) -> dict[str, int]:
        return dict(self._require_plan().phase_starts)

    def act(self, frame_index: int, observation: np.ndarray | None = None) -> np.ndarray:
        """The leader's position (float32 (6,), LeRobot units) at ``frame_index``.

        The leader is moved by the plan alone; ``observation`` is accepted as a person would see
        the follower, but this operator does not correct from it.
        """
        path = self._require_plan().path
        if frame_index < 0:
            raise SimError(f"frame index {frame_index} is negative")
        return path[min(frame_index, len(path) - 1)].copy()

    def leader_path(self) -> np.ndarray:
        """Every frame's leader position, float32 (num_frames, 6), LeRobot units."""
        return self._require_plan().path.copy()

    def watching(self, frame_index: int) -> bool:
        """Whether :meth:`watch_cube` could still re-plan at ``frame_index`` (before the grasp)."""
        plan = self._require_plan()
        return (
            plan.cube is not None
            and len(self.replans) < self.config.max_replans
            and 1 <= frame_index < plan.phase_starts["grasp"]
        )

    def watch_cube(
        self, frame_index: int, position: np.ndarray, quaternion: np.ndarray, speed: float = 0.0
    ) -> bool:
        """Look at the cube before frame ``frame_index`` is played, as the person on the leader
        does, and re-plan the rest of the episode if it was knocked away before the jaws closed
        on it (once it has come to rest). Returns whether the plan changed; the frames already
        played never change."""
        plan = self._require_plan()
        cfg = self.config
        if not self.watching(frame_index) or speed > cfg.replan_when_slower:
            return False
        assert plan.cube is not None
        yaw = cube_yaw(quaternion)
        turned = abs((yaw - plan.cube.yaw + math.pi / 4) % (math.pi / 2) - math.pi / 4)
        moved = math.hypot(position[0] - plan.cube.x, position[1] - plan.cube.y)
        if moved < cfg.replan_distance and turned < cfg.replan_angle:
            return False
        cube = CubePlacement(x=float(position[0]), y=float(position[1]), yaw=yaw, z=self.scene.cube_half_size)
        try:
            fresh = self._planned(cube, plan.path[frame_index - 1], home=plan.home)
        except SimError:
            return False  # out of reach: carry on, the episode will record the failure
        offset = frame_index - 1
        self._plan = Plan(
            waypoints=fresh.waypoints,
            path=np.concatenate([plan.path[:frame_index], fresh.path[1:]]),
            phase_starts={k: v + offset for k, v in fresh.phase_starts.items()},
            cube=cube,
            home=plan.home,
        )
        self.replans.append(frame_index)
        return True

    def take_over(self, frame_index: int, leader_units: np.ndarray, position: np.ndarray, yaw: float) -> bool:
        """Take the arm at ``frame_index`` from wherever its goal is (``leader_units``: the goal
        sent last, where a leader following the follower would be) with the cube at
        ``position``/``yaw``: the rest of the episode is planned from there, so the first goal
        of the takeover is one smooth step from the last. False (the plan unchanged) when the
        cube is out of reach from there."""
        plan = self._require_plan()
        cube = CubePlacement(x=float(position[0]), y=float(position[1]), yaw=yaw, z=self.scene.cube_half_size)
        try:
            fresh = self._planned(cube, np.asarray(leader_units, dtype=np.float32), home=plan.home)
        except SimError:
            return False
        offset = frame_index - 1
        self._plan = Plan(
            waypoints=fresh.waypoints,
            path=np.concatenate([plan.path[:frame_index], fresh.path[1:]]),
            phase_starts={k: v + offset for k, v in fresh.phase_starts.items()},
            cube=cube,
            home=plan.home,
        )
        self.replans.append(frame_index)
        return True

    # --- planning -----------------------------------------------------------------------------

    def _require_plan(self) -> Plan:
        if self._plan is None:
            raise SimError("ScriptedOperator.reset() must run before act()/leader_path()")
        return self._plan

    def _gripper_geometry(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Grasp point, approach axis and jaw axis, in the gripper body frame."""
        kin = self._kin
        kin.set_joints(np.zeros(NUM_JOINTS))
        site = kin.data.site(GRIPPER_SITE)
        _, body_rot = kin.body_frame()
        site_in_body = body_rot.T @ site.xmat.reshape(3, 3)
        approach, jaw = site_in_body[:, 0], site_in_body[:, 2]
        pad = kin.model.geom(JAW_PADS[0])
        pad_rot = np.zeros(9)
        mujoco.mju_quat2Mat(pad_rot, pad.quat)
        half_along_jaw = float(np.abs(pad_rot.reshape(3, 3).T @ jaw) @ pad.size)
        offset = half_along_jaw + self.scene.cube_half_size + self.config.fixed_jaw_clearance
        return pad.pos + jaw * offset, approach, jaw

    def _solve(
        self,
        q_init: np.ndarray,
        target: np.ndarray,
        jaw_direction: np.ndarray,
        what: str,
        *,
        tilt_ok: bool = False,
    ) -> np.ndarray:
        """Top-down pose; with ``tilt_ok`` (cube already held) the orientation may give way so
        the position is reached: the wrist cannot point straight down much above the table."""
        axes, directions = (self._approach_axis, self._jaw_axis), (DOWN, jaw_direction)
        result = self._kin.solve(q_init, self._grasp_point, target, axes, directions)
        if tilt_ok and not result.ok():
            result = self._kin.solve(
                result.q, self._grasp_point, target, axes, directions, angle_weight=0.01, iterations=400
            )
            # Holding the cube, a centimetre off still clears the rim and lands inside the bin.
            if result.position_error <= TILTED_POSITION_TOLERANCE:
                return result.q
        if not result.ok():
            raise SimError(
                f"seed {self.seed}: no arm pose reaches {what} at "
                f"{np.round(target, 3).tolist()} (residual "
                f"{result.position_error * 1000:.1f} mm, {result.angle_error:.3f} rad)"
            )
        return result.q

    def _least_roll(
        self,
        q_init: np.ndarray,
        target: np.ndarray,
        yaw: float,
        roll: float,
        what: str,
        *,
        tilt_ok: bool = False,
    ) -> tuple[np.ndarray, np.ndarray]:
        """The pose at ``target`` whose jaws lie along one of ``yaw + k*90deg`` (a cube is the
        same cube turned by a right angle) with the wrist roll nearest ``roll``.

        The wrist-roll axis is the approach axis, so the jaw direction costs only roll: reach
        the point pointing down with the roll held, read off the roll each direction needs,
        then refine with the cheapest one.
        """
        kin = self._kin
        seed_q = np.asarray(q_init, dtype=float).copy()
        seed_q[4] = roll
        pointing = kin.solve(seed_q, self._grasp_point, target, (self._approach_axis,), (DOWN,), moving=4)
        kin.set_joints(pointing.q)
        _, rotation = kin.body_frame()
        jaw_now = rotation @ self._jaw_axis
        roll_axis = rotation @ self._roll_axis
        low, high = kin.ranges[4]
        options = []
        for direction in self._jaw_directions(yaw):
            turn = math.atan2(float(cross3(jaw_now, direction) @ roll_axis), float(jaw_now @ direction))
            if low <= roll + turn <= high:
                options.append((abs(turn), roll + turn, direction))
        for _, new_roll, direction in sorted(options, key=lambda option: option[0]):
            start = pointing.q.copy()
            start[4] = new_roll
            try:
                return self._solve(start, target, direction, what, tilt_ok=tilt_ok), direction
            except SimError:
                continue
        raise SimError(
            f"seed {self.seed}: no jaw direction lets the arm reach {what} at {np.round(target, 3).tolist()}"
        )

    @staticmethod
    def _jaw_directions(yaw: float) -> list[np.ndarray]:
        return [
            np.array([math.cos(yaw + k * math.pi / 2), math.sin(yaw + k * math.pi / 2), 0.0])
            for k in range(4)
        ]

    def _planned(self, cube: CubePlacement, arm_units: np.ndarray, home: np.ndarray | None = None) -> Plan:
        self._kin.data.qpos[:] = self._kin_qpos
        try:
            return self._make_plan(cube, arm_units, home)
        finally:
            self._kin_qpos = self._kin.data.qpos.copy()

    def _make_plan(self, cube: CubePlacement, arm_units: np.ndarray, home: np.ndarray | None = None) -> Plan:
        cfg, scene = self.config, self.scene
        q_start = self.units.rad_from_units(arm_units.astype(np.float64))
        home = q_start.copy() if home is None else home
        half = scene.cube_half_size
        above_cube = cube.position + np.array([0, 0, cfg.hover_above])
        at_cube = cube.position.copy()
        lifted = np.array([cube.x, cube.y, cfg.lift_height])
        bx, by = scene.bin_center
        carry_z = max(cfg.lift_height, scene.bin_wall_height + half + cfg.rim_clearance)
        over_bin = np.array([bx, by, carry_z])
        in_bin = np.array([bx, by, scene.bin_wall_thickness + half + cfg.release_above_floor])

        # Of the four jaw directions that straddle the cube, take the least wrist roll.
        q_above, jaw_dir = self._least_roll(q_start[:5], above_cube, cube.yaw, q_start[4], "above the cube")
        q_at = self._solve(q_above, at_cube, jaw_dir, "the cube")
        q_lift = self._solve(q_at, lifted, jaw_dir, "the lift point", tilt_ok=True)
        q_over, place_dir = self._least_roll(
            q_lift, over_bin, math.atan2(jaw_dir[1], jaw_dir[0]), q_lift[4], "above the bin", tilt_ok=True
        )
        q_in = self._solve(q_over, in_bin, place_dir, "the release point", tilt_ok=True)

        g_open = self.units.rad_from_units(np.full(NUM_JOINTS, cfg.gripper_open))[GRIPPER_INDEX]
        g_closed = self.units.rad_from_units(np.full(NUM_JOINTS, cfg.gripper_closed))[GRIPPER_INDEX]
        mass = scene.cube_mass

        def pose(q5: np.ndarray, grip: float, payload: float = 0.0) -> np.ndarray:
            q = np.append(q5, grip)
            torque = self._kin.gravity_torque(q, payload, self._grasp_point)
            command = q.copy()
            command[:5] += torque[:5] / self._kp[:5]
            return command

        start = q_start.copy()
        steps = [
            ("reach", pose(q_above, g_open), None),
            ("descend", pose(q_at, g_open), None),
            ("grasp", pose(q_at, g_closed, mass), cfg.grasp_hold),
            ("lift", pose(q_lift, g_closed, mass), None),
            ("carry", pose(q_over, g_closed, mass), None),
            ("lower", pose(q_in, g_closed, mass), None),
            ("release", pose(q_in, g_open), cfg.release_hold),
            ("retreat", pose(q_over, g_open), None),
            ("home", home, None),
        ]
        plan = Plan()
        previous = start
        for name, command, fixed in steps:
            if fixed is None:
                move = float(np.max(np.abs(command[:5] - previous[:5])))
                duration = max(cfg.min_segment, move / cfg.joint_speed)
            else:
                duration = fixed
            duration *= float(self._rng.uniform(1 - cfg.timing_jitter, 1 + cfg.timing_jitter))
            plan.waypoints.append(Waypoint(name=name, command=command, duration=duration))
            previous = command
        plan.path, plan.phase_starts = self._sample(start, plan.waypoints)
        plan.cube = cube
        plan.home = home
        return plan

    def _sample(self, start: np.ndarray, waypoints: list[Waypoint]) -> tuple[np.ndarray, dict[str, int]]:
        segments = [start[np.newaxis]]
        phases: dict[str, int] = {}
        count = 1
        previous = start
        for waypoint in waypoints:
            phases[waypoint.name] = count
            frames = max(1, round(waypoint.duration * self.fps))
            tau = np.arange(1, frames + 1) / frames
            blend = 10 * tau**3 - 15 * tau**4 + 6 * tau**5
            segments.append(previous + blend[:, None] * (waypoint.command - previous))
            count += frames
            previous = waypoint.command
        phases["settle"] = count
        hold = max(1, round(self.config.final_hold * self.fps))
        segments.append(np.broadcast_to(previous, (hold, len(previous))))
        path = self.units.units_from_rad(np.concatenate(segments)).astype(np.float32)
        return path, phases


_SHARED = threading.local()


def shared_kinematics(scene: SceneConfig) -> ArmKinematics:
    """This thread's kinematics of ``scene``: a model copy and its data, made once rather than
    per episode (each operator restores its own solver data before planning)."""
    by_scene: dict[SceneConfig, ArmKinematics] = _SHARED.__dict__.setdefault("by_scene", {})
    if scene not in by_scene:
        by_scene[scene] = ArmKinematics(scene)
    return by_scene[scene]


def cube_yaw(quaternion: np.ndarray) -> float:
    """Heading of a cube's side faces: the angle of whichever body axis lies most nearly flat
    (a cube knocked onto another face is still gripped across two vertical faces)."""
    rotation = np.zeros(9)
    mujoco.mju_quat2Mat(rotation, np.asarray(quaternion, dtype=float))
    r = rotation.tolist()  # row-major: the body's axis j in world coordinates is column j
    flattest = min(range(3), key=lambda j: abs(r[6 + j]))
    return math.atan2(r[3 + flattest], r[flattest])
