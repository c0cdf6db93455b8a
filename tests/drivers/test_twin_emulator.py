"""The emulated arms backed by the sim: the follower is the MuJoCo twin, the leader the operator.

The emulator's calibration is the sim's (``hilrec.sim.units.emulated_calibration``), so what a
Feetech client reads is the twin's own units, up to the servo's tick quantisation.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from support.emulators import served

from hilrec.daemon.so101 import MAX_TICK, Role
from hilrec.drivers.arm import ArmConfig, FollowerConfig, SO101Follower, SO101Leader
from hilrec.drivers.bus import BusConfig, FeetechBus
from hilrec.drivers.calibration import ArmCalibration, save_calibration
from hilrec.drivers.emulated.emulator import EmulatedArm, EmulatorConfig
from hilrec.drivers.emulated.motion import TwinMotion
from hilrec.drivers.emulated.servo import EmulatedServo
from hilrec.drivers.emulated.sim_camera import SimCamera
from hilrec.sim import units
from hilrec.sim.operator import ScriptedOperator

HALF_TICK_DEG = 0.5 * 360 / MAX_TICK
# The twin's servos are position-controlled against gravity: the elbow rests 2.0 deg short of
# (or past) a goal in some poses, the same every run (the physics is deterministic).
STEADY_ERROR_DEG = 3.0


@pytest.fixture(scope="module")
def twin_follower() -> Iterator[EmulatedArm]:
    with served(EmulatedArm(EmulatorConfig(role=Role.FOLLOWER, motion="twin"))) as arm:
        yield arm


def test_emulator_uses_the_sims_calibration(twin_follower: EmulatedArm) -> None:
    assert twin_follower.frame.calibration == ArmCalibration.from_mapping(units.emulated_calibration())


def test_tick_grid_angles_read_exactly_the_twins_units(twin_follower: EmulatedArm) -> None:
    frame, umap = twin_follower.frame, units.default_units_map()
    servos = [EmulatedServo(i) for i in range(1, 7)]
    for servo, cal in zip(servos, frame.calibration.values(), strict=True):
        servo.set("Homing_Offset", cal.homing_offset)
    for k in (-700, -1, 0, 1, 333, 640):
        rad = np.full(6, k / units.TICKS_PER_RAD)
        rad[5] = umap.joint_ranges[5][0] + abs(k) / units.TICKS_PER_RAD  # gripper from closed
        ticks = [s.present_from_actual(a) for s, a in zip(servos, frame.actual_from_rad(rad), strict=True)]
        read = frame.calibration.ticks_to_units(ticks).astype(np.float32)
        np.testing.assert_array_equal(read, umap.units_from_rad(rad).astype(np.float32))


def test_follower_reads_and_drives_the_twin(twin_follower: EmulatedArm, tmp_path: Path) -> None:
    calibration = save_calibration(twin_follower.frame.calibration, tmp_path / "f.json")
    assert isinstance(twin_follower.motion, TwinMotion)
    twin = twin_follower.motion.twin
    with SO101Follower(FollowerConfig(port=twin_follower.port, calibration=calibration)) as arm:
        gripper = twin_follower.frame.calibration["gripper"]
        gripper_tick = 100 / (gripper.range_max - gripper.range_min)
        tolerance = np.array([HALF_TICK_DEG] * 5 + [gripper_tick / 2]) + 1e-4
        with twin_follower.paused():
            before = twin.observe()
        reading = arm.read().values
        with twin_follower.paused():  # the twin may have stepped a frame during the read
            observed = twin.observe()
        assert any(np.all(np.abs(reading - obs) <= tolerance) for obs in (before, observed)), (
            reading,
            before,
            observed,
        )

        goal = observed + np.array([10.0, -8.0, 6.0, 5.0, -20.0, 0.0], dtype=np.float32)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            arm.send_action(goal)
            if np.all(np.abs(arm.read().values[:5] - goal[:5]) < STEADY_ERROR_DEG):
                break
        with twin_follower.paused():
            moved, commanded = twin.observe(), twin.commanded()
        # The goal reached the twin's actuators (to within the tick it was written in, and the
        # tick's way back to degrees), and the joints went there, within what position control
        # leaves under gravity.
        assert np.all(np.abs(commanded[:5] - goal[:5]) <= 2 * HALF_TICK_DEG + 1e-4), (commanded, goal)
        assert np.all(np.abs(moved[:5] - goal[:5]) < STEADY_ERROR_DEG), (moved, goal)


@pytest.mark.slow
def test_leader_follows_the_scripted_operators_path(tmp_path: Path) -> None:
    leader_emu = EmulatedArm(EmulatorConfig(role=Role.LEADER))
    calibration = save_calibration(leader_emu.frame.calibration, tmp_path / "l.json")
    operator = ScriptedOperator(0)
    operator.reset()
    path = operator.leader_path()
    with served(leader_emu), SO101Leader(ArmConfig(port=leader_emu.port, calibration=calibration)) as arm:
        read = []
        deadline = time.monotonic() + 1.0
        while time.monotonic() < deadline:
            read.append(arm.read().values)
    readings = np.array(read)
    assert np.ptp(readings, axis=0).max() > 0.5  # the operator's hand moves it
    # Every reading lies on the operator's path, linearly interpolated between its frames.
    alphas = np.linspace(0.0, 1.0, 41)[None, :, None]
    dense = (path[:-1, None, :] + (path[1:] - path[:-1])[:, None, :] * alphas).reshape(-1, 6)
    for reading in readings[::10]:
        distance = np.abs(dense - reading).max(axis=1).min()
        assert distance < 0.5, (reading, distance)


def test_sim_camera_renders_the_emulated_followers_twin(twin_follower: EmulatedArm) -> None:
    with SimCamera.of_emulator(
        twin_follower, "front", image_size=(96, 128), fps=10, stall_timeout_s=10
    ) as camera:
        first = camera.latest()
        assert first.image.shape == (96, 128, 3) and first.image.dtype == np.uint8
        assert first.image.std() > 1.0  # a scene, not a blank frame
        newer = camera.wait_newer(first.index, timeout=10)
        assert newer.index > first.index and newer.captured_at > first.captured_at


class ManualClock:
    """Monotonic seconds that move only when the test moves them."""

    def __init__(self, start: float) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now


def test_a_goal_acts_within_a_physics_step_whatever_its_phase() -> None:
    """A goal written at any instant moves the joint at the next 5 ms physics step. Stepped in
    whole 40 ms frames on its own clock, the twin made a goal act up to a frame late depending
    on where the write fell between two frame boundaries (a random lag per recording)."""
    clock = ManualClock(1000.0)  # the motion's time origin: power-up
    emu = EmulatedArm(EmulatorConfig(role=Role.FOLLOWER, motion="twin"), clock=clock)
    assert isinstance(emu.motion, TwinMotion)
    step = emu.motion.twin.timestep
    frame, poll = 1 / 25, 0.0005
    delays_ms = {}
    with served(emu), FeetechBus(BusConfig(port=emu.port)) as bus:
        home = bus.read(1, "Present_Position")
        # 16 phases across a 25 Hz frame (2.66 ms apart: each at another point of its 5 ms step).
        for trial, phase in enumerate(np.arange(16) * frame * 17 / 256):
            write_at = 1000.0 + (trial + 1) * 25 * frame + phase  # whole frames, then the phase
            clock.now = write_at - 2 * step  # the last goal has long been reached
            before = bus.read(1, "Present_Position")
            clock.now = write_at
            assert bus.read(1, "Present_Position") == before  # at rest
            bus.write(1, "Goal_Position", home + 230 if trial % 2 == 0 else home)  # ~20 deg
            while clock.now < write_at + 2 * frame:
                clock.now += poll
                if bus.read(1, "Present_Position") != before:
                    break
            delays_ms[round(float(phase) * 1000, 1)] = round(float(clock.now - write_at) * 1000, 1)
    assert all(delay < 2 * step * 1000 for delay in delays_ms.values()), (
        f"delay (ms) from a goal write to the first Present_Position change, by phase: {delays_ms}"
    )
    assert max(delays_ms.values()) - min(delays_ms.values()) <= step * 1000 + poll * 1000


def test_a_batched_advance_reports_the_last_steps_speed() -> None:
    """The emulator steps an idle bus's motion several physics steps at a time: the speed a
    servo then reports is over the last step, as stepping one at a time gives, not the batch's
    mean (which lags a moving joint by half a batch)."""
    from hilrec.drivers.emulated.motion import MechanicalFrame

    one_at_a_time = TwinMotion(MechanicalFrame.from_sim(), seed=0)
    batched = TwinMotion(MechanicalFrame.from_sim(), seed=0)
    step = one_at_a_time.twin.timestep
    goal = [float(t) + 300.0 for t in one_at_a_time.actual()]
    for motion in (one_at_a_time, batched):
        motion.advance(0.0, [None] * len(goal))
    for n in range(1, 5):
        one_at_a_time.advance(n * step, goal)
    batched.advance(4 * step, goal)
    assert np.array_equal(batched.actual(), one_at_a_time.actual())
    assert np.abs(batched.velocity()).max() > 0  # moving
    assert np.array_equal(batched.velocity(), one_at_a_time.velocity())
