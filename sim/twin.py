"""The MuJoCo twin of an SO-101 follower in the pick-and-place scene.

It speaks the real arm's language: observations and commands are float32 vectors in LeRobot
units (:mod:`hilrec.sim.units`), one value per joint of :data:`hilrec.daemon.so101.JOINT_NAMES`.
Joints and actuators are found by name, never by position in MuJoCo's arrays, and nothing of
MuJoCo's mutable buffers leaves this class: every array returned is a copy.

The loop contract a recording relies on::

    obs = twin.observe()            # state before anything acts this frame
    executed = twin.command(action) # float32 first, then converted to ctrl; returned as executed
    twin.step_frame()               # exactly `substeps` physics steps

``get_state``/``set_state`` carry the full integration state (``mjSTATE_INTEGRATION``: time,
qpos, qvel, act, warm-start, ctrl, applied forces...), so feeding the recorded actions from a
restored start state reproduces every observation bit for bit.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import mujoco
import numpy as np

from hilrec.daemon.errors import ActionError, FrameError, FrameRateError, SimError
from hilrec.daemon.goals import GoalLimits
from hilrec.daemon.so101 import JOINT_NAMES, NUM_JOINTS
from hilrec.sim.render import SceneRenderer
from hilrec.sim.scene import (
    ARM_BODIES,
    CUBE_BODY,
    DEFAULT_TIMESTEP,
    CubePlacement,
    SceneConfig,
    Visual,
    compile_scene,
    place_cube,
)
from hilrec.sim.units import GRIPPER_INDEX, UnitsMap, units_map_from_ranges

STATE_SPEC = mujoco.mjtState.mjSTATE_INTEGRATION
SETTLE_SECONDS = 0.2
# Warnings after which the simulation state is no longer trustworthy.
_FATAL_WARNINGS = {
    mujoco.mjtWarning.mjWARN_BADQACC: "bad qacc (simulation diverged and was reset)",
    mujoco.mjtWarning.mjWARN_BADQVEL: "bad qvel",
    mujoco.mjtWarning.mjWARN_BADQPOS: "bad qpos",
    mujoco.mjtWarning.mjWARN_BADCTRL: "bad ctrl",
    mujoco.mjtWarning.mjWARN_CONTACTFULL: "contact buffer full",
    mujoco.mjtWarning.mjWARN_CNSTRFULL: "constraint buffer full",
    mujoco.mjtWarning.mjWARN_INERTIA: "bad inertia",
}


def _as_slice(indices: np.ndarray) -> slice | np.ndarray:
    """Consecutive indices as a slice (a view, no gather), others as they are."""
    first = int(indices[0])
    consecutive = np.array_equal(indices, np.arange(first, first + len(indices)))
    return slice(first, first + len(indices)) if consecutive else indices


def valid_frame_rates(timestep: float) -> list[int]:
    """Every whole fps whose frame is a whole number of ``timestep`` physics steps."""
    steps_per_second = round(1.0 / timestep)
    return [fps for fps in range(1, steps_per_second + 1) if steps_per_second % fps == 0]


def _check_fps(fps: int) -> None:
    if not isinstance(fps, int) or isinstance(fps, bool) or fps <= 0:
        raise FrameRateError(f"fps must be a positive integer, got {fps!r}")


def timestep_for(fps: int, timestep: float | None = None) -> float:
    """The physics step (s) of a twin at ``fps``: the one rule every twin, check and replay uses.

    A given ``timestep`` is respected: FrameRateError, naming the valid rates near ``fps``, unless
    ``1 / fps`` is a whole number of it. Without one, 5 ms wherever it divides the frame (25 fps:
    8 steps, as ever), else the largest step below 5 ms that does, ``1 / (fps * ceil(1 / (fps *
    5 ms)))``: 30 fps -> 7 steps of 1/210 s (4.76 ms), 24 fps -> 9 steps of 1/216 s.
    """
    _check_fps(fps)
    if timestep is not None:
        try:
            substeps_for(fps, timestep)
        except FrameRateError as exc:
            raise FrameRateError(
                f"{exc} (the timestep {timestep:g} s was given; without one, a step that divides "
                "the frame is chosen)"
            ) from None
        return float(timestep)
    exact = 1.0 / (fps * DEFAULT_TIMESTEP)
    if math.isclose(exact, round(exact), rel_tol=0, abs_tol=1e-9):
        return DEFAULT_TIMESTEP
    return 1.0 / (fps * math.ceil(exact))


def substeps_for(fps: int, timestep: float) -> int:
    """Physics steps per frame; FrameRateError (listing nearby valid rates) when not whole."""
    _check_fps(fps)
    exact = 1.0 / (fps * timestep)
    substeps = round(exact)
    if substeps < 1 or not math.isclose(substeps * fps * timestep, 1.0, rel_tol=0, abs_tol=1e-9):
        valid = valid_frame_rates(timestep)
        near = sorted(valid, key=lambda rate: (abs(rate - fps), rate))[:4]
        raise FrameRateError(
            f"fps {fps} is not a whole number of {timestep * 1000:g} ms physics steps "
            f"(1/{fps} s = {exact:.3f} steps); valid rates near it: "
            f"{', '.join(str(rate) for rate in sorted(near))}"
        )
    return substeps


@dataclass(frozen=True, kw_only=True)
class EpisodeStart:
    """What a reset made: the seed, where the cube went, and the full state to restore it."""

    seed: int
    cube: CubePlacement
    arm_units: np.ndarray  # float32 (6,) per arm, the arms' observation at the start
    state: np.ndarray  # float64, mjSTATE_INTEGRATION


@dataclass(frozen=True, kw_only=True)
class CubeState:
    position: np.ndarray  # (3,) m, world
    quaternion: np.ndarray  # (4,) w, x, y, z
    linear_velocity: np.ndarray
    angular_velocity: np.ndarray

    @property
    def speed(self) -> float:
        return float(np.linalg.norm(self.linear_velocity))

    def to_dict(self) -> dict[str, list[float]]:
        return {
            "position": self.position.tolist(),
            "quaternion": self.quaternion.tolist(),
            "linear_velocity": self.linear_velocity.tolist(),
            "angular_velocity": self.angular_velocity.tolist(),
        }


class Twin:
    """SO-101 follower + scene in MuJoCo, stepped a frame at a time."""

    def __init__(
        self,
        *,
        fps: int = 25,
        cameras: Sequence[str] = ("front",),
        image_size: tuple[int, int] = (480, 640),
        scene: SceneConfig | None = None,
        render_quality: Visual = "fast",
    ) -> None:
        scene = scene or SceneConfig()
        timestep = timestep_for(fps, scene.timestep)
        # The scene as run: with the chosen step, so a twin made from ``twin.scene`` is this world.
        self.scene = scene if scene.timestep == timestep else dataclasses.replace(scene, timestep=timestep)
        self._model = compile_scene(self.scene, "none")
        self._data = mujoco.MjData(self._model)
        self.fps = fps
        self.timestep = float(self._model.opt.timestep)
        self.substeps = substeps_for(fps, self.timestep)
        # Every joint by its model name; two arms: left_shoulder_pan ... right_gripper, the
        # dataset's column order (each arm's six, left first).
        prefixes = self.scene.arm_prefixes
        self.arms = len(prefixes)
        self.joint_names: tuple[str, ...] = tuple(p + n for p in prefixes for n in JOINT_NAMES)
        self._qpos_adr = np.array([self._model.joint(n).qposadr[0] for n in self.joint_names])
        self._actuator_ids = np.array([self._actuator_for(n) for n in self.joint_names])
        # One arm's map: both arms are the same packaged SO-101, so they convert alike.
        self.units: UnitsMap = units_map_from_ranges(
            {n: tuple(self._model.joint(prefixes[0] + n).range) for n in JOINT_NAMES}
        )
        self._scale = np.tile(self.units.scale, self.arms)
        self._offset = np.tile(self.units.offset, self.arms)
        self._grippers = [GRIPPER_INDEX + NUM_JOINTS * arm for arm in range(self.arms)]
        # The per-frame maths on Python floats: the same IEEE double operations as numpy's on
        # arrays of six, without a numpy call (~1-2 us each between MuJoCo steps) per operation.
        self._scale_list, self._offset_list = self._scale.tolist(), self._offset.tolist()
        self._arm_qpos = _as_slice(self._qpos_adr)
        self.limits = GoalLimits(*self._command_limits(), names=self.joint_names)
        self._arm_ctrl = _as_slice(self._actuator_ids)
        cube_joint = self._model.joint(CUBE_BODY)
        self._cube_qpos = int(cube_joint.qposadr[0])
        self._cube_dof = int(cube_joint.dofadr[0])
        arm_bodies = [p + b for p in prefixes for b in ARM_BODIES]
        self._push_bodies = {name: self._model.body(name).id for name in (CUBE_BODY, *arm_bodies)}
        self._state_size = mujoco.mj_stateSize(self._model, STATE_SPEC)
        self.geom_names: tuple[str, ...] = tuple(self._model.geom(i).name for i in range(self._model.ngeom))
        # Views into MjData's buffers, which stay where they are for its lifetime: the per-frame
        # calls skip the bindings' attribute lookups.
        self._qpos = self._data.qpos
        self._ctrl = self._data.ctrl
        self._xfrc_applied = self._data.xfrc_applied
        self._warning_counts = self._data.warning.number
        self._warnings_seen = np.zeros(len(self._warning_counts), dtype=np.int64)
        self._warning_bytes = self._warning_counts.tobytes()
        self.cameras = tuple(cameras)
        height, width = image_size
        self.image_size = (height, width)
        self._render_quality = render_quality
        self._renderer: SceneRenderer | None = None
        self.frame_index = 0
        self.clipped_commands = 0
        self._pushed = False
        if self.cameras:
            self._get_renderer().check_size(self.image_size)
            for camera in self.cameras:
                self._get_renderer().check_camera(camera)

    # --- lifecycle ----------------------------------------------------------------------------

    def close(self) -> None:
        if self._renderer is not None:
            self._renderer.close()
            self._renderer = None

    def __enter__(self) -> Twin:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def reset(self, seed: int, *, arm_units: Sequence[float] | None = None) -> EpisodeStart:
        """Arm at its start pose, cube placed from ``seed``, settled; time restarts at 0."""
        placement = place_cube(seed, self.scene)
        start_units = np.asarray(
            arm_units if arm_units is not None else self.scene.arm_start, dtype=np.float32
        )
        if start_units.shape == (NUM_JOINTS,) and self.arms > 1:
            start_units = np.tile(start_units, self.arms)  # every arm from the same pose
        mujoco.mj_resetData(self._model, self._data)
        self._warnings_seen[:] = 0
        self._warning_bytes = self._warning_counts.tobytes()
        start_rad = np.asarray(start_units, dtype=np.float64) / self._scale + self._offset
        self._data.qpos[self._qpos_adr] = start_rad
        self._data.qpos[self._cube_qpos : self._cube_qpos + 3] = placement.position
        self._data.qpos[self._cube_qpos + 3 : self._cube_qpos + 7] = placement.quaternion
        self.command(start_units)
        # Let contacts and servos reach rest before the episode's clock starts.
        settle_steps = round(SETTLE_SECONDS / self.timestep)
        mujoco.mj_step(self._model, self._data, nstep=settle_steps)
        self._check_warnings("settling after reset")
        self._data.time = 0.0
        self.clipped_commands = 0
        state = self.get_state()
        # Restoring what was just captured makes the recording run from exactly what a replay
        # restores, down to the quantities a state does not carry.
        self.set_state(state)
        return EpisodeStart(seed=seed, cube=placement, arm_units=self.observe(), state=state)

    # --- the loop -----------------------------------------------------------------------------

    def observe(self) -> np.ndarray:
        """Joint positions in LeRobot units, float32 (6,): what the real arm would report.

        The gripper is clipped to [0, 100] as LeRobot's RANGE_0_100 clips the ticks to the
        calibrated range (a soft joint limit lets the sim jaw pass its limit by a hair)."""
        units = [
            (rad - offset) * scale
            for rad, offset, scale in zip(
                self._qpos[self._arm_qpos].tolist(), self._offset_list, self._scale_list, strict=True
            )
        ]
        for gripper in self._grippers:
            units[gripper] = min(max(units[gripper], 0.0), 100.0)
        return np.array(units, dtype=np.float32)

    def command(self, action: Sequence[float] | np.ndarray) -> np.ndarray:
        """Cast to float32, clip to the joint limits, write ctrl; return the executed command."""
        try:
            executed, clamped = self.limits.clamp(action)
        except ActionError as exc:
            raise FrameError("action", str(exc)) from None
        if clamped:
            self.clipped_commands += 1
        command = executed.tolist()
        # float32 -> float64 is exact, so ctrl is a function of the recorded number alone.
        self._ctrl[self._arm_ctrl] = [
            value / scale + offset
            for value, scale, offset in zip(command, self._scale_list, self._offset_list, strict=True)
        ]
        return executed

    def step_frame(self) -> None:
        """Exactly ``substeps`` physics steps; applied pushes last for this frame only."""
        mujoco.mj_step(self._model, self._data, nstep=self.substeps)
        if self._pushed:
            self._xfrc_applied[:] = 0.0
            self._pushed = False
        if self._warning_counts.tobytes() != self._warning_bytes:  # a count went up
            self._check_warnings(f"frame {self.frame_index}")
        self.frame_index += 1

    def push(self, body: str, force: Sequence[float], torque: Sequence[float] = (0, 0, 0)) -> None:
        """Apply a force (N) and torque (N m) at ``body``'s centre of mass during the next frame."""
        body_id = self._push_bodies.get(body)
        if body_id is None:
            raise SimError(f"cannot push '{body}': pushable bodies are {', '.join(self._push_bodies)}")
        wrench = np.concatenate([np.asarray(force, float), np.asarray(torque, float)])
        if wrench.shape != (6,) or not np.isfinite(wrench).all():
            raise SimError(f"push on '{body}': force and torque must be 3 finite numbers each")
        self._data.xfrc_applied[body_id] += wrench
        self._pushed = True

    # --- state --------------------------------------------------------------------------------

    def get_state(self) -> np.ndarray:
        state = np.empty(self._state_size)
        mujoco.mj_getState(self._model, self._data, state, STATE_SPEC)
        return state

    def set_state(self, state: np.ndarray) -> None:
        state = np.asarray(state, dtype=np.float64)
        if state.shape != (self._state_size,):
            raise SimError(
                f"a twin state has {self._state_size} values "
                f"(mjSTATE_INTEGRATION of this model), got shape {state.shape}"
            )
        if not np.isfinite(state).all():
            raise SimError("refusing a twin state with non-finite values")
        mujoco.mj_setState(self._model, self._data, state, STATE_SPEC)
        self._pushed = bool(self._data.xfrc_applied.any())
        mujoco.mj_forward(self._model, self._data)
        self._check_warnings("set_state")
        self.frame_index = 0

    def commanded(self) -> np.ndarray:
        """The six servo targets in LeRobot units, float32: what :meth:`command` last executed,
        read back from the actuators (so a command that never reached them shows)."""
        units = [
            (rad - offset) * scale
            for rad, offset, scale in zip(
                self._ctrl[self._arm_ctrl].tolist(), self._offset_list, self._scale_list, strict=True
            )
        ]
        return np.array(units, dtype=np.float32)

    def actuator_targets(self) -> np.ndarray:
        """The servo targets (ctrl, rad) of the six joints, as last commanded (a copy)."""
        return self._data.ctrl[self._actuator_ids].copy()

    @property
    def time(self) -> float:
        return float(self._data.time)

    @property
    def state_size(self) -> int:
        return self._state_size

    def cube_state(self) -> CubeState:
        q = self._data.qpos[self._cube_qpos : self._cube_qpos + 7]
        v = self._data.qvel[self._cube_dof : self._cube_dof + 6]
        return CubeState(
            position=q[:3].copy(),
            quaternion=q[3:].copy(),
            linear_velocity=v[:3].copy(),
            angular_velocity=v[3:].copy(),
        )

    def contact_id_pairs(self) -> set[tuple[int, int]]:
        """The (low, high) geom id pairs in contact after the last step, each pair once."""
        return {(a, b) if a < b else (b, a) for a, b in self._data.contact.geom.tolist()}

    def physics_info(self) -> dict[str, Any]:
        opt = self._model.opt
        return {
            "timestep": self.timestep,
            "substeps": self.substeps,
            "fps": self.fps,
            "integrator": mujoco.mjtIntegrator(opt.integrator).name,
            "cone": mujoco.mjtCone(opt.cone).name,
            "impratio": float(opt.impratio),
            "state_spec": "mjSTATE_INTEGRATION",
            "state_size": self._state_size,
        }

    # --- pixels -------------------------------------------------------------------------------

    def render(self, camera: str, size: tuple[int, int] | None = None) -> np.ndarray:
        """uint8 (H, W, 3) image of any camera in the scene, from the current state."""
        return self._get_renderer().render(self._data.qpos, camera, size or self.image_size)

    def _get_renderer(self) -> SceneRenderer:
        if self._renderer is None:
            self._renderer = SceneRenderer(self.scene, nq=self._model.nq, quality=self._render_quality)
        return self._renderer

    # --- internals ----------------------------------------------------------------------------

    def _actuator_for(self, joint: str) -> int:
        joint_id = self._model.joint(joint).id
        for i in range(self._model.nu):
            if (
                self._model.actuator_trntype[i] == mujoco.mjtTrn.mjTRN_JOINT
                and self._model.actuator_trnid[i, 0] == joint_id
            ):
                return i
        raise SimError(f"no actuator drives joint '{joint}' in the SO-101 model")

    def _command_limits(self) -> tuple[np.ndarray, np.ndarray]:
        """float32 unit limits whose radians stay inside each actuator's ctrlrange."""
        ctrl = self._model.actuator_ctrlrange[self._actuator_ids]
        scale, offset = self._scale, self._offset
        low = ((ctrl[:, 0] - offset) * scale).astype(np.float32)
        high = ((ctrl[:, 1] - offset) * scale).astype(np.float32)
        for i in range(len(self.joint_names)):
            while float(low[i]) / scale[i] + offset[i] < ctrl[i, 0]:
                low[i] = np.nextafter(low[i], np.float32(np.inf))
            while float(high[i]) / scale[i] + offset[i] > ctrl[i, 1]:
                high[i] = np.nextafter(high[i], np.float32(-np.inf))
        return low, high

    def _check_warnings(self, where: str) -> None:
        counts = self._warning_counts.astype(np.int64)
        fresh = np.nonzero(counts > self._warnings_seen)[0]
        self._warnings_seen = counts
        self._warning_bytes = self._warning_counts.tobytes()
        for index in fresh:
            problem = _FATAL_WARNINGS.get(mujoco.mjtWarning(index))
            if problem is not None:
                raise SimError(f"MuJoCo warning at {where} (sim time {self._data.time:.4f} s): {problem}")
