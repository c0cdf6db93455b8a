"""Where an emulated arm's six horns are: motion models behind one small protocol.

Every model works in *actual* encoder ticks (float, before the servo subtracts its
Homing_Offset) against the monotonic wall clock. The emulated arm's mechanics are fixed by the
emulated calibration (``hilrec.sim.units.emulated_calibration``): a joint at sim angle ``rad``
reads ``present(rad)`` ticks under that calibration, so its encoder reads
``present(rad) + homing_offset``. That is the bridge between the twin and the registers, and the
reason a LeRobot client reading the emulator sees exactly the twin's units.

- :class:`ServoMotion`: a first-order position servo with a speed limit and a torque limit, and
  a person's hand on the arm (:mod:`hilrec.drivers.emulated.hand`: where it moves the arm, when
  it holds it, and who wins when it and the torque disagree).
- :class:`TwinMotion`: the follower is the MuJoCo twin, stepped one physics step (5 ms, or the
  daemon's twin timestep) at a time up to the current instant: goals become actuator targets
  (in LeRobot units, through the calibration), encoder readings come from the joint angles.
- Hand paths: :func:`wave_path` (smooth sines), :class:`SweepPath` (a person calibrating:
  holds the middle until the homing offsets are written, then sweeps every range) and
  :class:`OperatorPath` (the sim's scripted operator's planned leader path, seed after seed).
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import numpy as np

from hilrec.daemon.so101 import JOINT_NAMES, NUM_JOINTS
from hilrec.drivers.calibration import ArmCalibration
from hilrec.drivers.emulated.hand import FULL_TORQUE, Hand

if TYPE_CHECKING:  # MuJoCo is imported only when a twin is made
    from hilrec.sim.operator import ScriptedOperator
    from hilrec.sim.twin import Twin

Path = Callable[[float], np.ndarray]  # seconds since start -> actual ticks (6,)
_MID = 2047.0
# The physics step (s) of an emulated follower's twin when none is passed to TwinMotion: the
# daemon sets it in its ``hilrec emulate follower`` child's environment to the step its own twins
# take ([twin] timestep, or the one hilrec.sim.twin.timestep_for chooses for its fps). Unset: 5 ms.
TIMESTEP_ENV = "HILREC_TWIN_TIMESTEP"
# The torque (Torque_Limit units, 0.1 % of the stall torque) an unloaded arm's servo needs to
# reach its no-load speed; with less to spare it goes slower, in proportion.
FULL_SPEED_TORQUE = 250.0


class ArmMotion(Protocol):
    def advance(self, now: float, targets: Sequence[float | None]) -> None:
        """Move to wall-clock ``now``; ``targets[i]`` is servo i's actual goal, None if limp."""
        ...

    def actual(self) -> np.ndarray:
        """Encoder ticks (6,), float64."""
        ...

    def velocity(self) -> np.ndarray:
        """Ticks per second (6,), float64."""
        ...

    def close(self) -> None: ...

    # Optional: ``next_due() -> float | None``, when the model wants to advance on its own
    # (the twin's next physics step); while the bus is idle the emulator calls ``advance`` once a
    # batch of steps is due (IDLE_STEP_BATCH_S in the emulator).
    # Optional: ``limit_torque(limits)``, each servo's Torque_Limit, given before each advance.


@dataclass(frozen=True)
class MechanicalFrame:
    """The emulated arm's fixed mechanics: sim angle <-> encoder ticks, per joint, affine.

    ``actual = zero + rad * ticks_per_rad``, with ``zero`` the encoder reading at sim angle 0,
    taken from :func:`hilrec.sim.units.present_position` and the emulated calibration's offsets.
    """

    zero: np.ndarray  # (6,)
    ticks_per_rad: float
    calibration: ArmCalibration

    @classmethod
    def from_sim(cls) -> MechanicalFrame:
        from hilrec.sim import units

        calibration = ArmCalibration.from_mapping(
            units.emulated_calibration(), source="hilrec.sim.units.emulated_calibration()"
        )
        zero = np.array(
            [units.present_position(name, 0.0) + calibration[name].homing_offset for name in JOINT_NAMES]
        )
        return cls(zero, units.TICKS_PER_RAD, calibration)

    def with_calibration(self, calibration: ArmCalibration) -> MechanicalFrame:
        """The same arm calibrated differently: its middle and offsets follow ``calibration``.

        Body joints read their calibrated middle at sim angle 0; the gripper reads ``range_min``
        at its sim lower limit (closed), as in the emulated calibration.
        """
        from hilrec.sim import units

        gripper_low = units.default_units_map().joint_ranges[JOINT_NAMES.index("gripper")][0]
        zero = []
        for name, cal in calibration.items():
            at_zero = cal.range_min - gripper_low * self.ticks_per_rad if name == "gripper" else cal.mid
            zero.append(at_zero + cal.homing_offset)
        return MechanicalFrame(np.array(zero), self.ticks_per_rad, calibration)

    def actual_from_rad(self, rad: np.ndarray) -> np.ndarray:
        return self.zero + np.asarray(rad, dtype=np.float64) * self.ticks_per_rad

    def rad_from_actual(self, actual: np.ndarray) -> np.ndarray:
        return (np.asarray(actual, dtype=np.float64) - self.zero) / self.ticks_per_rad

    def middle(self) -> np.ndarray:
        """Encoder ticks of the pose that reads 2047 on every joint under the calibration."""
        return np.array([_MID + cal.homing_offset for cal in self.calibration.values()])

    def range_ends(self) -> tuple[np.ndarray, np.ndarray]:
        offsets = np.array([cal.homing_offset for cal in self.calibration.values()], dtype=float)
        low = np.array([cal.range_min for cal in self.calibration.values()], dtype=float)
        high = np.array([cal.range_max for cal in self.calibration.values()], dtype=float)
        return low + offsets, high + offsets


class ServoMotion:
    """Six first-order position servos (time constant ``tau_s``, speed cap ``max_speed``), and
    the hand of a person on them (:mod:`hilrec.drivers.emulated.hand`).

    A servo under torque drives to its goal at its no-load speed, scaled down when the torque it
    has to spare is below :data:`FULL_SPEED_TORQUE`: its Torque_Limit (:meth:`limit_torque`),
    less the hand's force when the hand holds it; a hand stronger than the limit wins, and the
    joint goes where the hand takes it. A servo
    without torque goes where the hand takes it, or stays put while the hand rests.
    """

    def __init__(
        self,
        initial: np.ndarray,
        *,
        hand: Path | Hand | None = None,
        tau_s: float = 0.03,
        max_speed: float = 3000.0,
    ) -> None:
        self._pos = np.asarray(initial, dtype=np.float64).copy()
        self._vel: np.ndarray = np.zeros(NUM_JOINTS)
        self._hand = hand if isinstance(hand, Hand) or hand is None else Hand(hand)
        self._tau = tau_s
        self._max_speed = max_speed  # ticks/s: about an STS3215's no-load 270 deg/s
        self._torque: np.ndarray = np.full(NUM_JOINTS, FULL_TORQUE)
        self._t0: float | None = None
        self._last: float | None = None

    def limit_torque(self, limits: Sequence[float]) -> None:
        """Each servo's Torque_Limit (0.1 % of its stall torque), in force from the next step."""
        self._torque = np.clip(np.asarray(limits, dtype=np.float64), 0.0, FULL_TORQUE)

    def advance(self, now: float, targets: Sequence[float | None]) -> None:
        if self._t0 is None or self._last is None:
            self._t0 = self._last = now
            return
        dt = now - self._last
        if dt <= 0:
            return
        self._last = now
        under_torque = any(t is not None for t in targets)
        hand = None if self._hand is None else self._hand.target(now - self._t0, self._pos, under_torque)
        force = self._hand.force if hand is not None and self._hand is not None else 0.0
        previous = self._pos.copy()
        gain = 1.0 - math.exp(-dt / self._tau)
        for i, target in enumerate(targets):
            spare = 0.0 if target is None else self._torque[i] - force
            if hand is not None and (target is None or spare < 0):
                self._pos[i] = hand[i]  # no torque, or less than the hand's force: the hand wins
            elif target is not None:
                step_cap = self._max_speed * dt * min(1.0, spare / FULL_SPEED_TORQUE)
                self._pos[i] += max(-step_cap, min(step_cap, (target - self._pos[i]) * gain))
        self._vel = (self._pos - previous) / dt

    def actual(self) -> np.ndarray:
        return self._pos.copy()

    def velocity(self) -> np.ndarray:
        return self._vel.copy()

    def place(self, actual: np.ndarray) -> None:
        """Put the horns somewhere by hand (tests: 'the person moved the arm')."""
        self._pos = np.asarray(actual, dtype=np.float64).copy()

    def close(self) -> None:
        pass


def wave_path(frame: MechanicalFrame, *, amplitude: float = 0.3, period_s: float = 4.0) -> Path:
    """Slow sines through ``amplitude`` of each joint's calibrated range, one phase per joint."""
    low, high = frame.range_ends()
    centre, half = (low + high) / 2, (high - low) / 2 * amplitude
    phases = np.arange(NUM_JOINTS) * (2 * math.pi / NUM_JOINTS)

    def path(t: float) -> np.ndarray:
        return centre + half * np.sin(2 * math.pi * t / period_s + phases)

    return path


class SweepPath:
    """A person calibrating: hold the middle, then sweep every joint through its whole range.

    The sweep starts once ``ready()`` is true (the emulator passes "every servo got its homing
    offset written"), so a calibration reads the middle before anything moves, with no timing
    guess. ``sweep_s`` goes middle -> min -> max -> middle, dwelling ``dwell_s`` at each end.
    """

    def __init__(
        self, frame: MechanicalFrame, ready: Callable[[], bool], *, sweep_s: float = 0.8, dwell_s: float = 0.3
    ) -> None:
        self._middle = frame.middle()
        self._low, self._high = frame.range_ends()
        self._ready = ready
        self._sweep_s, self._dwell_s = sweep_s, dwell_s
        self._start: float | None = None
        self.done = threading.Event()

    def restart(self, low: np.ndarray | None = None, high: np.ndarray | None = None) -> None:
        """Sweep once more, between these ends (ticks; default the frame's): a person who moves
        only part of a joint's travel, then is asked again."""
        if low is not None:
            self._low = np.asarray(low, dtype=float)
        if high is not None:
            self._high = np.asarray(high, dtype=float)
        self.done.clear()
        self._start = None

    def __call__(self, t: float) -> np.ndarray:
        if self._start is None:
            if not self._ready():
                return self._middle.copy()
            self._start = t
        leg = self._sweep_s / 4
        s = t - self._start
        waypoints = [
            (self._middle, self._low, leg),
            (self._low, self._low, self._dwell_s),
            (self._low, self._high, 2 * leg),
            (self._high, self._high, self._dwell_s),
            (self._high, self._middle, leg),
        ]
        for start, end, duration in waypoints:
            if s < duration:
                return start + (end - start) * (s / duration)
            s -= duration
        self.done.set()
        return self._middle.copy()


class OperatorPath:
    """The sim's scripted operator moving the leader: its planned paths, one seed after another.

    The operator plans a whole episode open loop (``ScriptedOperator.leader_path()``, float32
    LeRobot units at the sim fps). ``plans`` episodes are planned up front (a plan takes
    25-150 ms, far too long to compute while a servo owes a reply), joined by ``blend_s`` of
    linear motion from one plan's last pose to the next one's first, and played in a loop.
    Between two frames the path interpolates linearly, as a hand moves continuously.
    """

    def __init__(
        self,
        frame: MechanicalFrame,
        *,
        seed: int = 0,
        fps: int = 25,
        plans: int = 6,
        blend_s: float = 1.0,
        operator_factory: Callable[[int], ScriptedOperator] | None = None,
    ) -> None:
        from hilrec.sim import units

        if operator_factory is None:
            from hilrec.sim.operator import ScriptedOperator

            operator_factory = ScriptedOperator
        umap = units.default_units_map()
        pieces = []
        for episode_seed in range(seed, seed + plans):
            operator = operator_factory(episode_seed)
            operator.reset()
            pieces.append(np.asarray(operator.leader_path(), dtype=np.float64))
        blend = np.linspace(0.0, 1.0, max(2, round(blend_s * fps)))[1:-1, None]
        joined = []
        for i, piece in enumerate(pieces):
            following = pieces[(i + 1) % len(pieces)]
            joined += [piece, piece[-1] + (following[0] - piece[-1]) * blend]
        self._ticks = frame.actual_from_rad(umap.rad_from_units(np.concatenate(joined)))
        self._frame_dt = 1.0 / fps

    def __call__(self, t: float) -> np.ndarray:
        frames = (t / self._frame_dt) % len(self._ticks)
        i = int(frames)
        following = self._ticks[(i + 1) % len(self._ticks)]
        return self._ticks[i] + (following - self._ticks[i]) * (frames - i)


class TwinMotion:
    """The follower is the MuJoCo twin, stepped one physics step (its timestep) at a time.

    The emulator advances it lazily to the current instant before it handles any packet (so
    before a Present_* register is read and before a goal is applied) and while the bus is
    idle. A goal written at time t therefore drives the joint from the physics step under way
    at t: it acts within one step of t whatever the phase of the write, as a real servo responds
    continuously. (Stepped in whole frames on its own clock, a goal written just after a frame
    boundary waited for the next one: up to a frame of lag, random from one recording to the
    next.) A servo with torque on drives its joint's actuator to its goal (converted to LeRobot
    units through the calibration); a servo without torque holds its joint where it is.

    A twin given with several physics steps per frame is re-made at one (same scene, same
    state); ``self.twin`` is the one stepped. Without one, the twin steps ``timestep`` (default:
    :data:`TIMESTEP_ENV` from the environment, else 5 ms), which must be 1/n s.
    """

    def __init__(
        self,
        frame: MechanicalFrame,
        *,
        twin: Twin | None = None,
        seed: int = 0,
        max_catch_up_s: float = 2.0,
        timestep: float | None = None,
    ) -> None:
        if twin is None:
            from hilrec.sim.scene import DEFAULT_TIMESTEP, SceneConfig
            from hilrec.sim.twin import Twin

            step = timestep if timestep is not None else _environment_timestep()
            # One physics step per "frame": the step rate is the twin's fps.
            rate = round(1.0 / (step or DEFAULT_TIMESTEP))
            twin = Twin(fps=rate, cameras=(), scene=SceneConfig(timestep=step))
            twin.reset(seed)
        elif twin.substeps != 1:
            twin = _one_step_twin(twin)
        self.twin = twin
        self._frame = frame
        self._units = twin.units
        self._step_s = 1.0 / twin.fps  # one physics step
        self._max_catch_up = max(1, round(max_catch_up_s / self._step_s))
        self._t0: float | None = None
        self._steps = 0
        self._pos = self._ticks(twin.observe())
        self._vel: np.ndarray = np.zeros(NUM_JOINTS)

    def _ticks(self, units_values: np.ndarray) -> np.ndarray:
        return self._frame.actual_from_rad(self._units.rad_from_units(units_values))

    def next_due(self) -> float | None:
        """When the next physics step is due (the emulator steps an idle bus's motion in batches
        of :data:`hilrec.drivers.emulated.emulator.IDLE_STEP_BATCH_S`)."""
        return None if self._t0 is None else self._t0 + (self._steps + 1) * self._step_s

    def advance(self, now: float, targets: Sequence[float | None]) -> None:
        if self._t0 is None:
            self._t0 = now
        # A step ending exactly at ``now`` is due: float error must not hold it back a step.
        wanted = math.floor((now - self._t0) / self._step_s + 1e-9)
        if wanted <= self._steps:
            return
        # A stalled client must not make the next request pay for minutes of physics.
        self._steps = max(self._steps, wanted - self._max_catch_up)
        goal = np.array([self._pos[i] if t is None else t for i, t in enumerate(targets)])
        before_last = self._pos
        self.twin.command(self._units.units_from_rad(self._frame.rad_from_actual(goal)))
        if wanted - self._steps > 1:
            while self._steps < wanted - 1:
                self.twin.step_frame()
                self._steps += 1
            before_last = self._ticks(self.twin.observe())
        self.twin.step_frame()
        self._steps += 1
        self._pos = self._ticks(self.twin.observe())
        # Over the last physics step, as a servo reports its speed now: an advance may cover
        # several steps (the emulator steps an idle bus in batches), and their mean lags.
        self._vel = (self._pos - before_last) / self._step_s

    def actual(self) -> np.ndarray:
        return self._pos.copy()

    def velocity(self) -> np.ndarray:
        return self._vel.copy()

    def close(self) -> None:
        self.twin.close()


def _environment_timestep() -> float | None:
    import os

    from hilrec.daemon.errors import ConfigError

    text = os.environ.get(TIMESTEP_ENV, "").strip()
    if not text:
        return None
    try:
        return float(text)
    except ValueError:
        raise ConfigError(TIMESTEP_ENV, f"a physics step in seconds, got {text!r}") from None


def _one_step_twin(twin: Twin) -> Twin:
    """``twin`` re-made stepping one physics step per frame, in the same scene and state."""
    from hilrec.sim.twin import Twin

    single = Twin(
        fps=round(1.0 / twin.timestep), cameras=twin.cameras, image_size=twin.image_size, scene=twin.scene
    )
    single.set_state(twin.get_state())
    twin.close()
    return single
