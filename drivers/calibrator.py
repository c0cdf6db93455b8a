"""LeRobot's SO-101 calibration procedure, step by step, with no terminal in it.

The steps are those of ``SOFollower.calibrate`` / ``SOLeader.calibrate`` in LeRobot 0.4.4, so
the file that comes out is the one LeRobot would write for the same arm:

1. torque off (and Lock 0), position mode;
2. the person puts the arm in the middle of its range: the offsets are reset (Homing_Offset 0,
   limits 0..4095), Present_Position is read, and ``Homing_Offset = present - 2047`` is written
   so that pose reads 2047 (half a turn);
3. the person moves every joint but wrist_roll through its whole range while the positions are
   sampled; the extremes are the range (wrist_roll gets 0..4095). A sample with no reply after
   the bus's retries is skipped and counted (LeRobot stops the whole procedure on one): the
   person is half way through moving six joints, and a lost reply on a USB adapter is no reason
   to start again. Only replies missing for ``SILENT_LIMIT_S`` in a row end it (the arm is gone);
4. the offsets and limits are written to the servos and the file is saved.

Prompts and key presses belong to the command (``cmd_calibrate``); this class takes a
``until()`` callable so tests and scripts can drive it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from hilrec.daemon.errors import BusPacketError, BusTimeoutError, CalibrationError
from hilrec.daemon.so101 import JOINT_NAMES, MAX_TICK, MOTOR_IDS
from hilrec.drivers.bus import FeetechBus
from hilrec.drivers.calibration import (
    FULL_TURN_JOINT,
    ArmCalibration,
    MotorCalibration,
    half_turn_homing,
)
from hilrec.drivers.tables import OperatingMode

log = logging.getLogger(__name__)

# Replies missing this long in a row while the ranges are recorded: the arm is gone, not a lost reply.
SILENT_LIMIT_S = 2.0

Sample = Callable[[dict[str, int], dict[str, int], dict[str, int]], None]


class Calibrator:
    def __init__(self, bus: FeetechBus) -> None:
        self.bus = bus
        self.homing_offsets: dict[str, int] | None = None
        self.missed_samples = 0  # of the last record_ranges: no reply after the bus's retries

    def prepare(self) -> None:
        """Step 1: torque off (Lock 0) so the person can move the arm; position mode."""
        self.bus.set_torque(MOTOR_IDS, enabled=False)
        for servo_id in MOTOR_IDS:
            self.bus.write(servo_id, "Operating_Mode", OperatingMode.POSITION)

    def set_middle(self) -> dict[str, int]:
        """Step 2, with the arm held at the middle of its range: write half-turn homings."""
        for servo_id in MOTOR_IDS:  # LeRobot's reset_calibration
            self.bus.write(servo_id, "Homing_Offset", 0)
            self.bus.write(servo_id, "Min_Position_Limit", 0)
            self.bus.write(servo_id, "Max_Position_Limit", MAX_TICK)
        present = self.bus.sync_read("Present_Position", MOTOR_IDS, check_status=False).values
        offsets: dict[str, int] = {}
        for name, servo_id in zip(JOINT_NAMES, MOTOR_IDS, strict=True):
            try:
                offsets[name] = half_turn_homing(present[servo_id])
            except CalibrationError as exc:
                raise CalibrationError(f"joint '{name}' (id {servo_id}): {exc}") from None
            self.bus.write(servo_id, "Homing_Offset", offsets[name])
        self.homing_offsets = offsets
        return offsets

    def record_ranges(
        self,
        until: Callable[[], bool],
        *,
        on_sample: Sample | None = None,
        interval_s: float = 0.01,
        every_joint: bool = True,
    ) -> tuple[dict[str, int], dict[str, int]]:
        """Step 3: sample positions until ``until()`` is true; return (mins, maxes). With
        ``every_joint`` a joint that did not move at all is an error (not on a second pass,
        which adds to a first one only the joints moved again)."""
        joints = [name for name in JOINT_NAMES if name != FULL_TURN_JOINT]
        ids = [MOTOR_IDS[JOINT_NAMES.index(name)] for name in joints]

        self.missed_samples = 0
        answered = time.monotonic()

        def sample() -> dict[str, int] | None:
            nonlocal answered
            try:
                values = self.bus.sync_read("Present_Position", ids, check_status=False).values
            except (BusTimeoutError, BusPacketError):
                if time.monotonic() - answered > SILENT_LIMIT_S:
                    raise
                self.missed_samples += 1
                return None
            answered = time.monotonic()
            return {name: values[sid] for name, sid in zip(joints, ids, strict=True)}

        mins: dict[str, int] = {}
        maxes: dict[str, int] = {}
        while True:
            positions = sample()
            if positions is not None:
                for name, value in positions.items():
                    mins[name] = min(mins.get(name, value), value)
                    maxes[name] = max(maxes.get(name, value), value)
                if on_sample is not None:
                    on_sample(mins, positions, maxes)
            if mins and until():  # an Enter before the first reply waits for one
                break
            time.sleep(interval_s)
        still = [name for name in joints if mins[name] == maxes[name] and every_joint]
        if still:
            raise CalibrationError(
                f"joints {', '.join(still)} did not move: their range of motion was not recorded"
            )
        return mins, maxes

    def finish(
        self, mins: dict[str, int], maxes: dict[str, int], *, source: str = "<calibration>"
    ) -> ArmCalibration:
        """Step 4: build the calibration (wrist_roll 0..4095) and write it to the servos."""
        if self.homing_offsets is None:
            raise CalibrationError("set_middle() must run before finish()")
        motors = {}
        for name, servo_id in zip(JOINT_NAMES, MOTOR_IDS, strict=True):
            low, high = (0, MAX_TICK) if name == FULL_TURN_JOINT else (mins[name], maxes[name])
            motors[name] = MotorCalibration(
                id=servo_id,
                drive_mode=0,
                homing_offset=self.homing_offsets[name],
                range_min=low,
                range_max=high,
            )
        calibration = ArmCalibration(motors, source)
        for cal in calibration.values():
            self.bus.write(cal.id, "Homing_Offset", cal.homing_offset)
            self.bus.write(cal.id, "Min_Position_Limit", cal.range_min)
            self.bus.write(cal.id, "Max_Position_Limit", cal.range_max)
        return calibration
