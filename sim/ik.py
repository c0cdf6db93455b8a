"""Inverse kinematics for the SO-101 arm on a private copy of the scene model.

Damped least squares on MuJoCo's Jacobians (``mj_jac``): a point fixed in the gripper body is
driven to a world position while two body axes (the approach axis and the jaw axis) are turned
toward world directions. The arm has five joints and a top-down grasp asks for six numbers, but
for a pose the arm can reach they are consistent, and DLS settles on it.

Also here: the static joint torques the servos must supply at a pose (gravity), so a planner can
ask a position servo for a little more than the angle it wants to reach, as a person does with
a leader arm when the follower sags.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Sequence
from dataclasses import dataclass

import mujoco
import numpy as np

from hilrec.daemon.so101 import JOINT_NAMES
from hilrec.sim.scene import GRIPPER_BODY, SceneConfig, compile_scene

ARM_JOINTS = JOINT_NAMES[:5]


@dataclass(frozen=True, kw_only=True)
class IKResult:
    q: np.ndarray  # (5,) arm joint angles, rad
    position_error: float  # m
    angle_error: float  # rad, worst of the two axes
    iterations: int

    def ok(self, position_tolerance: float = 2e-3, angle_tolerance: float = 0.05) -> bool:
        return self.position_error <= position_tolerance and self.angle_error <= angle_tolerance


class ArmKinematics:
    """Forward/inverse kinematics and gravity torques of the arm, on its own MjData."""

    def __init__(self, scene: SceneConfig) -> None:
        # A private copy: nothing done here can touch a twin's model or data.
        self.model = copy.copy(compile_scene(scene, "none"))
        self.data = mujoco.MjData(self.model)
        self.body = self.model.body(GRIPPER_BODY).id
        joints = [self.model.joint(name) for name in JOINT_NAMES]
        self.qpos_adr = np.array([j.qposadr[0] for j in joints])
        self.dof_adr = np.array([j.dofadr[0] for j in joints])
        self.ranges = np.array([j.range for j in joints])
        self._jacp = np.zeros((3, self.model.nv))
        self._jacr = np.zeros((3, self.model.nv))
        # Views into MjData (its buffers never move): the solver loop reads them every iteration.
        self._qpos = self.data.qpos
        self._body_xpos = self.data.xpos[self.body]
        self._body_xmat = self.data.xmat[self.body].reshape(3, 3)
        first = int(self.dof_adr[0])
        # The arm's dofs are consecutive: Jacobian columns by slice, not by fancy index.
        self._dofs_consecutive = bool(np.array_equal(self.dof_adr[:5], np.arange(first, first + 5)))

    def set_joints(self, q: np.ndarray) -> None:
        """Set the first len(q) of the six joints (arm, then gripper) and update kinematics."""
        self._qpos[self.qpos_adr[: len(q)]] = q
        mujoco.mj_kinematics(self.model, self.data)
        mujoco.mj_comPos(self.model, self.data)  # mj_jac needs the com-based dof frames

    def body_frame(self) -> tuple[np.ndarray, np.ndarray]:
        """World position and rotation matrix of the gripper body at the current joints."""
        return self._body_xpos.copy(), self._body_xmat.copy()

    def solve(
        self,
        q_init: np.ndarray,
        point: np.ndarray,
        target: np.ndarray,
        axes: Sequence[np.ndarray],
        directions: Sequence[np.ndarray],
        *,
        angle_weight: float = 0.1,
        iterations: int = 200,
        moving: int = 5,
    ) -> IKResult:
        """Arm joints putting body-frame ``point`` at ``target`` with ``axes`` along ``directions``.

        Only the first ``moving`` arm joints move. Stops when converged or when the joints stop
        moving (a limit, or a target out of reach).
        """
        low, high = self.ranges[:5, 0].copy(), self.ranges[:5, 1].copy()
        q = np.clip(np.asarray(q_init, dtype=float), low, high)
        low[moving:] = high[moving:] = q[moving:]
        dofs: slice | np.ndarray = (
            slice(int(self.dof_adr[0]), int(self.dof_adr[0]) + moving)
            if self._dofs_consecutive
            else self.dof_adr[:moving]
        )
        regulariser = 1e-3 * np.eye(6)
        err = np.empty(6)
        jac = np.zeros((6, 5))
        # 0.05 mm and 0.03 deg: far below what a position servo holds, one or two DLS
        # iterations sooner than tighter bounds.
        close_enough, aligned = 5e-5**2, math.cos(5e-4)
        done = 0
        rotation = self._body_xmat
        while done < iterations:
            done += 1
            self.set_joints(q)
            world_point = self._body_xpos + rotation @ point
            err[:3] = target - world_point
            e_rot = np.zeros(3)
            worst = 1.0
            for axis, direction in zip(axes, directions, strict=True):
                current = rotation @ axis
                e_rot += cross3(current, direction)
                worst = min(worst, float(current @ direction))
            err[3:] = angle_weight * e_rot
            if err[:3] @ err[:3] < close_enough and worst > aligned:
                break
            mujoco.mj_jac(self.model, self.data, self._jacp, self._jacr, world_point, self.body)
            jac[:3, :moving] = self._jacp[:, dofs]
            jac[3:, :moving] = angle_weight * self._jacr[:, dofs]
            step = jac.T @ np.linalg.solve(jac @ jac.T + regulariser, err)
            q_next = np.minimum(np.maximum(q + step, low), high)  # np.clip, without its wrapper
            if np.abs(q_next - q).max() < 1e-7:
                break
            q = q_next
        return self._result(q, point, target, axes=axes, directions=directions, iterations=done)

    def _result(
        self,
        q: np.ndarray,
        point: np.ndarray,
        target: np.ndarray,
        *,
        axes: Sequence[np.ndarray],
        directions: Sequence[np.ndarray],
        iterations: int,
    ) -> IKResult:
        self.set_joints(q)
        position, rotation = self.body_frame()
        position_error = float(np.linalg.norm(target - (position + rotation @ point)))
        angle_error = max(
            float(np.arccos(np.clip((rotation @ axis) @ direction, -1.0, 1.0)))
            for axis, direction in zip(axes, directions, strict=True)
        )
        return IKResult(q=q, position_error=position_error, angle_error=angle_error, iterations=iterations)

    def gravity_torque(
        self, q: np.ndarray, payload: float = 0.0, payload_point: np.ndarray | None = None
    ) -> np.ndarray:
        """Joint torques (6,) holding the arm still at ``q`` (six joints), plus an optional
        ``payload`` mass (kg) held at body-frame ``payload_point`` of the gripper."""
        self.data.qpos[self.qpos_adr] = q
        self.data.qvel[:] = 0.0
        mujoco.mj_forward(self.model, self.data)
        torque = self.data.qfrc_bias[self.dof_adr].copy()
        if payload > 0.0 and payload_point is not None:
            position, rotation = self.body_frame()
            world_point = position + rotation @ payload_point
            mujoco.mj_jac(self.model, self.data, self._jacp, self._jacr, world_point, self.body)
            weight = np.array([0.0, 0.0, payload * 9.81])
            torque += self._jacp[:, self.dof_adr].T @ weight
        return torque


def cross3(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """a x b of two 3-vectors, bit-equal to np.cross (the same products and differences)."""
    # np.cross costs ~20 us of argument handling per call, numpy scalars ~100 ns an operation;
    # Python floats do the same IEEE products and differences. This runs thousands of times a plan.
    a0, a1, a2 = a.tolist()
    b0, b1, b2 = b.tolist()
    return np.array([a1 * b2 - a2 * b1, a2 * b0 - a0 * b2, a0 * b1 - a1 * b0])
