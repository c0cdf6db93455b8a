"""SO-101 follower and leader arms: LeRobot's configuration, calibration and units on our bus.

Lifecycle is explicit: ``open()`` checks the six servos (ids 1..6, model 777), loads the
calibration (a file, or LeRobot's calibration directory by arm id), writes it to the servos if
their EEPROM disagrees, and configures them as LeRobot 0.4.4 does; ``close()`` turns torque off
(in a ``finally``) and releases the port. Both are context managers.

- Follower: position mode, P/I/D (LeRobot's 16/0/32), gripper torque limits, torque on.
  ``send_action`` casts to float32 *first*, clamps each joint's step from the present position
  (``max_relative_target``), converts that float32 number to ticks and sync-writes it: the
  returned float32 array is exactly what the servos were told, i.e. the action to record.
- Leader: torque off and EEPROM unlocked (Lock 0); it is sent goals only when a rollout keeps it
  following the follower under a low torque limit (``hold_under_torque``, ``send_feedback``).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from hilrec.daemon.errors import (
    ActionError,
    BusTimeoutError,
    CalibrationError,
    ConfigError,
    DeviceError,
    ServoFaultError,
)
from hilrec.daemon.goals import GoalLimits, inner_bounds
from hilrec.daemon.so101 import JOINT_NAMES, MOTOR_IDS, NUM_JOINTS, BodyMode, Role
from hilrec.drivers.bus import BusConfig, FeetechBus, SyncReading
from hilrec.drivers.calibration import (
    ArmCalibration,
    default_arm_id,
    lerobot_calibration_path,
    load_calibration,
    ticks_to_units,
    units_to_ticks,
)
from hilrec.drivers.tables import MODEL_NUMBER_STS3215, OperatingMode, describe_status

log = logging.getLogger(__name__)

_GRIPPER = "gripper"


@dataclass(frozen=True, kw_only=True)
class ArmConfig:
    port: str
    # LeRobot's arm id: the calibration file is <id>.json. None: the role's default
    # (hilrec.drivers.calibration.DEFAULT_ARM_IDS, what `hilrec calibrate ROLE` writes).
    id: str | None = None
    calibration: Path | None = None  # None: LeRobot's calibration directory
    body_mode: BodyMode = BodyMode.DEGREES
    read_retries: int = 2
    reply_timeout_ms: float | None = None
    # A servo whose EEPROM (offsets, limits) disagrees with the file gets the file written to
    # it, as LeRobot does when told to use the file; False refuses to open instead.
    write_calibration: bool = True
    # Error bits that do not stop a read (e.g. 0x20 for a gripper that squeezes an object).
    tolerated_status: int = 0

    def validate(self) -> None:
        if self.read_retries < 0:
            raise ConfigError("read_retries", f"must be >= 0, got {self.read_retries}")


@dataclass(frozen=True, kw_only=True)
class FollowerConfig(ArmConfig):
    # Largest step per command, in units, from the present position: one number for every
    # joint or one per joint name. None: no clamp.
    max_relative_target: float | dict[str, float] | None = None
    p_coefficient: int = 16
    i_coefficient: int = 0
    d_coefficient: int = 32
    gripper_max_torque_limit: int = 500
    gripper_protection_current: int = 250
    gripper_overload_torque: int = 25
    disable_torque_on_close: bool = True

    def validate(self) -> None:
        super().validate()
        caps = self.max_relative_target
        if isinstance(caps, dict):
            unknown = sorted(set(caps) - set(JOINT_NAMES))
            missing = sorted(set(JOINT_NAMES) - set(caps))
            if unknown or missing:
                raise ConfigError(
                    "max_relative_target",
                    f"needs exactly the joints "
                    f"{', '.join(JOINT_NAMES)} (unknown {unknown}, missing {missing})",
                )
            values = list(caps.values())
        else:
            values = [] if caps is None else [caps]
        if any(not v > 0 for v in values):
            raise ConfigError("max_relative_target", f"must be positive, got {caps}")


LeaderConfig = ArmConfig


@dataclass(frozen=True)
class ArmReading:
    """Six joint positions in units (float32, joint order), the ticks they came from, and how."""

    values: np.ndarray
    ticks: tuple[int, ...]
    attempts: int
    status: dict[int, int]

    @property
    def retries(self) -> int:
        return self.attempts - 1


@dataclass(frozen=True)
class SentAction:
    """What the follower was told: float32 units (the recorded action) and the ticks sent."""

    sent: np.ndarray
    ticks: tuple[int, ...]
    clamped: bool


class _SO101Arm:
    role: Role

    def __init__(self, config: ArmConfig) -> None:
        config.validate()
        self.config = config
        self.bus = FeetechBus(
            BusConfig(port=config.port, retries=config.read_retries, reply_timeout_ms=config.reply_timeout_ms)
        )
        self.arm_id = config.id or default_arm_id(self.role)
        self.calibration_path = config.calibration or lerobot_calibration_path(self.role, self.arm_id)
        self._calibration: ArmCalibration | None = None
        self._silent = False  # open() found no servo answering at all
        self._max_step: np.ndarray | None = None
        self._limits: tuple[ArmCalibration, GoalLimits] | None = None

    def __repr__(self) -> str:
        return f"SO-101 {self.role} '{self.arm_id}' on {self.config.port}"

    @property
    def calibrate_command(self) -> str:
        """The command that writes the calibration file this arm reads."""
        where = (
            f"--output {self.calibration_path}"
            if self.config.calibration is not None
            else f"--id {self.arm_id}"
        )
        return f"hilrec calibrate {self.role} --port {self.config.port} {where}"

    @property
    def is_open(self) -> bool:
        return self._calibration is not None and self.bus.is_open

    @property
    def calibration(self) -> ArmCalibration:
        if self._calibration is None:
            raise DeviceError(f"{self!r} is not open")
        return self._calibration

    # --- lifecycle --------------------------------------------------------------------------

    def open(self) -> None:
        if not self.calibration_path.exists():
            raise CalibrationError(
                f"{self.calibration_path}: no calibration file for the {self.role} '{self.arm_id}'; "
                f"calibrate it first: {self.calibrate_command}"
            )
        calibration = load_calibration(self.calibration_path)
        self.bus.open()
        self._silent = False
        try:
            self._check_servos()
            self._apply_calibration(calibration)
            self._configure()
        except BaseException:
            if self._silent:
                self.bus.close()  # nothing there to make safe: do not wait out more silences
            else:
                self._release()
            raise
        self._calibration = calibration
        log.info("%r open (calibration %s)", self, self.calibration_path)

    def close(self) -> None:
        if not self.bus.is_open:
            return
        self._calibration = None
        self._release()

    def _release(self) -> None:
        try:
            self._make_safe()
        except DeviceError as exc:  # a vanished port cannot be made safe; still release it
            log.warning("%r: could not turn torque off while closing: %s", self, exc)
        finally:
            self.bus.close()

    def _make_safe(self) -> None:
        self.bus.set_torque(MOTOR_IDS, enabled=False)

    def __enter__(self) -> _SO101Arm:
        self.open()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _check_servos(self) -> None:
        error, self._silent = check_servos(self.bus, who=repr(self), role=self.role)
        if error is not None:
            raise error

    def _apply_calibration(self, calibration: ArmCalibration) -> None:
        """Make the servos' EEPROM match the file (Homing_Offset, position limits)."""
        stale = []
        for name, cal in calibration.items():
            stored = (
                self.bus.read(cal.id, "Homing_Offset"),
                self.bus.read(cal.id, "Min_Position_Limit"),
                self.bus.read(cal.id, "Max_Position_Limit"),
            )
            if stored != (cal.homing_offset, cal.range_min, cal.range_max):
                stale.append(name)
        if not stale:
            return
        if not self.config.write_calibration:
            raise CalibrationError(
                f"{self!r}: servos {', '.join(stale)} hold a calibration "
                f"different from {self.calibration_path}"
            )
        log.info("%r: writing %s to joints %s", self, self.calibration_path, ", ".join(stale))
        self.bus.set_torque(MOTOR_IDS, enabled=False)  # EEPROM writes need Lock 0
        for name in stale:
            cal = calibration[name]
            self.bus.write(cal.id, "Homing_Offset", cal.homing_offset)
            self.bus.write(cal.id, "Min_Position_Limit", cal.range_min)
            self.bus.write(cal.id, "Max_Position_Limit", cal.range_max)

    def _configure_common(self) -> None:
        """LeRobot's configure_motors plus position mode, with torque off and EEPROM unlocked."""
        self.bus.set_torque(MOTOR_IDS, enabled=False)
        for servo_id in MOTOR_IDS:
            self.bus.write(servo_id, "Return_Delay_Time", 0)
            self.bus.write(servo_id, "Maximum_Acceleration", 254)
            self.bus.write(servo_id, "Acceleration", 254)
            self.bus.write(servo_id, "Operating_Mode", OperatingMode.POSITION)

    def _configure(self) -> None:
        raise NotImplementedError

    @property
    def limits(self) -> GoalLimits:
        """The calibrated range of each joint in dataset units (and the arm's step cap): every
        goal is clamped to it, so no command, whatever its source, leaves the calibrated range."""
        calibration = self.calibration
        if self._limits is None or self._limits[0] is not calibration:
            modes = calibration.modes(self.config.body_mode)
            cals = list(calibration.motors.values())
            ends = np.array(
                [
                    sorted(
                        (ticks_to_units(cal.range_min, cal, mode), ticks_to_units(cal.range_max, cal, mode))
                    )
                    for cal, mode in zip(cals, modes, strict=True)
                ]
            )

            def inside(joint: int, value: float) -> bool:
                cal = cals[joint]
                return cal.range_min <= units_to_ticks(value, cal, modes[joint]) <= cal.range_max

            low, high = inner_bounds(ends[:, 0], ends[:, 1], inside)
            self._limits = (calibration, GoalLimits(low, high, self._max_step))
        return self._limits[1]

    # --- reading ----------------------------------------------------------------------------

    def _sync_read_positions(self) -> SyncReading:
        try:
            return self.bus.sync_read("Present_Position", MOTOR_IDS)
        except ServoFaultError as exc:
            reading = getattr(exc, "reading", None)  # attached by FeetechBus.sync_read
            if not isinstance(reading, SyncReading) or any(
                bits & ~self.config.tolerated_status for bits in reading.faulted.values()
            ):
                raise
            log.debug(
                "%r: tolerated status %s",
                self,
                {sid: describe_status(b) for sid, b in reading.faulted.items()},
            )
            return reading

    def read(self) -> ArmReading:
        """Present positions in units, float32 in joint order (LeRobot's float64 maths, cast)."""
        reading = self._sync_read_positions()
        ticks = tuple(reading.values[sid] for sid in MOTOR_IDS)
        units = self.calibration.ticks_to_units(ticks, self.config.body_mode)
        return ArmReading(units.astype(np.float32), ticks, reading.attempts, reading.status)


class SO101Leader(_SO101Arm):
    """The arm a person moves: torque off and read, unless told to follow the follower.

    A policy rollout may put it under a low torque limit (:meth:`hold_under_torque`) and send it
    the follower's joints (:meth:`send_feedback`, as LeRobot 0.6.1's ``send_feedback``), so the
    person's hand finds it where the arm is; :meth:`release` lets it go, and ``close`` turns the
    torque off whatever happened before.
    """

    role: Role = Role.LEADER

    def _configure(self) -> None:
        self._configure_common()

    def get_action(self) -> ArmReading:
        return self.read()

    def hold_under_torque(self, torque_limit: int, present: np.ndarray) -> None:
        """Torque on, at ``torque_limit`` (0.1 % of the stall torque), holding ``present`` (units,
        the leader's reading): the goal is written first, so the servos never start from a stale one."""
        if not 1 <= torque_limit <= 1000:
            raise ActionError(f"{self!r}: a Torque_Limit is 1..1000, got {torque_limit}")
        hold, _ = self.limits.clamp(present)
        ticks = self.calibration.units_to_ticks([float(v) for v in hold], self.config.body_mode)
        self.bus.sync_write("Torque_Limit", dict.fromkeys(MOTOR_IDS, torque_limit))
        self.bus.sync_write("Goal_Position", dict(zip(MOTOR_IDS, ticks, strict=True)))
        self.bus.sync_write("Torque_Enable", dict.fromkeys(MOTOR_IDS, 1))

    def send_feedback(self, goal: np.ndarray, present: np.ndarray, max_step: float) -> SentAction:
        """Drive the leader toward ``goal`` (units, the follower's joints), at most ``max_step``
        units from ``present`` (the leader's own reading) and inside its calibrated range."""
        limits = self.limits
        step = np.full(NUM_JOINTS, float(max_step))
        sent, clamped = GoalLimits(limits.low, limits.high, step).clamp(goal, present=present)
        ticks = self.calibration.units_to_ticks([float(v) for v in sent], self.config.body_mode)
        self.bus.sync_write("Goal_Position", dict(zip(MOTOR_IDS, ticks, strict=True)))
        return SentAction(sent, tuple(ticks), clamped)

    def release(self) -> None:
        """Torque off at once (one packet): the person's hand has the arm."""
        self.bus.sync_write("Torque_Enable", dict.fromkeys(MOTOR_IDS, 0))

    def __enter__(self) -> SO101Leader:
        self.open()
        return self


class SO101Follower(_SO101Arm):
    """The arm that copies: position mode, gains, clamped goals, torque on while open."""

    role: Role = Role.FOLLOWER
    config: FollowerConfig

    def __init__(self, config: FollowerConfig) -> None:
        super().__init__(config)
        self._max_step = _per_joint(config.max_relative_target)

    def __enter__(self) -> SO101Follower:
        self.open()
        return self

    def _configure(self) -> None:
        cfg = self.config
        self._configure_common()
        for servo_id, name in zip(MOTOR_IDS, JOINT_NAMES, strict=True):
            self.bus.write(servo_id, "P_Coefficient", cfg.p_coefficient)
            self.bus.write(servo_id, "I_Coefficient", cfg.i_coefficient)
            self.bus.write(servo_id, "D_Coefficient", cfg.d_coefficient)
            if name == _GRIPPER:
                self.bus.write(servo_id, "Max_Torque_Limit", cfg.gripper_max_torque_limit)
                self.bus.write(servo_id, "Protection_Current", cfg.gripper_protection_current)
                self.bus.write(servo_id, "Overload_Torque", cfg.gripper_overload_torque)
        # Hold where it stands: a stale Goal_Position would make the arm jump on torque on.
        # Servo by servo: a unicast read waits out a reply a loaded host holds back (patience_ms),
        # where a sync read gives up after its retries and would fail the whole open.
        present = {sid: self.bus.read(sid, "Present_Position", check_status=False) for sid in MOTOR_IDS}
        self.bus.sync_write("Goal_Position", present)
        self.bus.set_torque(MOTOR_IDS, enabled=True)

    def _make_safe(self) -> None:
        if self.config.disable_torque_on_close:
            self.bus.set_torque(MOTOR_IDS, enabled=False)

    def get_observation(self) -> ArmReading:
        return self.read()

    def send_action(self, action: np.ndarray | list[float], present: np.ndarray | None = None) -> SentAction:
        """Command six joint goals (units). Returns the float32 goals actually sent.

        ``present`` (units) is the observation the loop just read; with a clamp configured and
        no ``present`` the positions are read first, as LeRobot does.
        """
        limits = self.limits
        now = None
        if limits.max_step is not None:
            now = self.read().values if present is None else np.asarray(present, np.float32)
        try:
            goal, clamped = limits.clamp(action, present=now)
        except ActionError as exc:
            raise ActionError(
                f"{self!r}: an action is {NUM_JOINTS} finite numbers in the order "
                f"{', '.join(JOINT_NAMES)}; {exc}"
            ) from None
        ticks = self.calibration.units_to_ticks([float(v) for v in goal], self.config.body_mode)
        self.bus.sync_write("Goal_Position", dict(zip(MOTOR_IDS, ticks, strict=True)))
        return SentAction(goal, tuple(ticks), clamped)


def check_servos(bus: FeetechBus, *, who: str, role: Role) -> tuple[DeviceError | None, bool]:
    """Ping the six servos (ids 1..6, model 777). Returns what is wrong, as the error to raise
    (None: all six are there), and whether the port is silent (no servo answers at all).

    A silent port is told apart quickly: when servo 1 kept silent through its retries and
    patience, the others get one quick ping each; if none answers, waiting out every servo's
    patience (and the daemon's open retries) for the same silence helps nobody."""
    missing: list[int] = []
    port = bus.port_name
    for servo_id in MOTOR_IDS:
        try:
            model = bus.ping(servo_id)
        except BusTimeoutError:
            if servo_id == MOTOR_IDS[0] and not _anything_answers(bus):
                rate = bus.config.baudrate
                speed = f"{rate / 1e6:g} Mbps" if rate >= 1_000_000 else f"{rate} bps"
                return DeviceError(
                    f"{who}: no servo answers (ids {MOTOR_IDS[0]}..{MOTOR_IDS[-1]} at {speed}). "
                    "Check: the arm's power supply is on (USB alone does not power the servos); "
                    "this is the arm's port (hilrec find-port); its servos were set up with ids "
                    f"1..6 at 1 Mbps (hilrec setup-motors {role} --port {port})"
                ), True
            missing.append(servo_id)
            continue
        if model != MODEL_NUMBER_STS3215:
            return DeviceError(
                f"{who}: servo id {servo_id} is model {model}, expected an STS3215 ({MODEL_NUMBER_STS3215})"
            ), False
    if missing:
        names = ", ".join(f"{sid} ({JOINT_NAMES[MOTOR_IDS.index(sid)]})" for sid in missing)
        return BusTimeoutError(
            f"servo(s) {names} do not answer: check their cables in the chain, and that each was "
            f"given its id (hilrec setup-motors {role} --port {port})",
            port=port,
            servo_id=missing[0],
            register="PING",
        ), False
    return None, False


def _anything_answers(bus: FeetechBus) -> bool:
    for servo_id in MOTOR_IDS[1:]:
        try:
            bus.ping(servo_id, quick=True)
            return True
        except BusTimeoutError:
            continue
        except DeviceError:
            return True  # something is there, if unwell; the full check names it
    return False


def _per_joint(caps: float | Mapping[str, float] | None) -> np.ndarray | None:
    if caps is None:
        return None
    if isinstance(caps, Mapping):
        return np.array([float(caps[name]) for name in JOINT_NAMES])
    return np.full(NUM_JOINTS, float(caps))
