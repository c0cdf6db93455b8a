"""Hardware-like recordings for the replay-check tests, made on the MuJoCo twin.

The follower is a twin (the emulated arm's follower is a twin too); the leader is a smooth path of
random waypoints that keeps the jaws off the table. The recorder follows hilrec's loop contract:
read the follower, read the leader, command, step a frame, write the row. Faults are injected where
a real setup would have them:

- ``latency_frames``: the follower receives each leader command that many frames late, while the
  row records the leader reading of its own frame (a slow bus or a queue between the two arms);
- ``obs_shift_frames``: the ``observation.state`` column is written that many frames late;
- ``frozen``: from a frame on, one servo ignores its goal and holds where it is (it stopped
  responding to commands), while its reading stays truthful;
- ``start`` and ``max_speed_deg_s``: the take starts with the follower away from the leader (at
  its rest pose, say), and its servos move at most that fast, as a real STS3215 does (about
  270 deg/s unloaded, less under load) and the twin's actuators do not: the follower swings to
  the leader more slowly than the twin would, then tracks.
"""

from __future__ import annotations

import contextlib
import json
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from support.emulators import served

from hilrec.daemon.so101 import ACTION_KEY, JOINT_NAMES, ROBOT_TYPE, STATE_KEY, so101_features

if TYPE_CHECKING:  # MuJoCo and the emulator load only in the tests that record
    from hilrec.drivers.emulated.motion import ArmMotion
    from hilrec.sim.twin import Twin

FPS = 25
TASK = "move the arm"
# Centre and half-span of the waypoints, in LeRobot units: well inside the ranges, jaws above the
# table (checked with the twin's contacts when this was written).
_CENTRE = np.array([0.0, -60.0, 30.0, 40.0, 0.0, 40.0])
_SPAN = np.array([35.0, 25.0, 25.0, 20.0, 45.0, 35.0])
_SEGMENT_S = 1.2
# Reads of the emulated follower on the tick clock, before its servo is made silent (each attempt
# is the driver's own read, retries and reply timeout included).
LOADED_READ_ATTEMPTS = 5


@dataclass(frozen=True)
class Frozen:
    joint: str
    from_frame: int


@dataclass(frozen=True)
class RecordingSpec:
    seed: int = 0
    frames: int = 250
    latency_frames: int = 0  # synthetic recorder: whole frames
    latency_ms: float = 0.0  # emulated recorder: wall-clock time
    obs_shift_frames: int = 0
    frozen: Frozen | None = None  # the servo stops following its goal (reading truthful)
    unresponsive: Frozen | None = None  # emulated path: the servo stops answering on the bus
    # Emulated path: (frame, n) from that frame the next n replies of the first servo leave after
    # the client gave up, as a loaded host's pty holds them; the arm itself is sound.
    held_replies: tuple[int, int] | None = None
    missed_slots: tuple[tuple[int, int], ...] = ()  # (row, tick slots the recorder missed before it)
    keep_slots: bool = True  # write the tick slots beside the episode, as hilrec's daemon does
    start: tuple[float, ...] | None = None  # the follower's pose at frame 0; None: at the leader
    max_speed_deg_s: float | None = None  # the follower's servos' speed cap (synthetic recorder)


@dataclass(frozen=True)
class Episode:
    spec: RecordingSpec
    action: np.ndarray  # float32 (n, 6), degrees / 0..100
    state: np.ndarray  # float32 (n, 6)
    frame_flags: np.ndarray | None = None  # uint32 (n,), hilrec's FrameFlag bits
    tick_slot: np.ndarray | None = None  # int64 (n,), the pacer slot of each row


def leader_path(seed: int, frames: int, fps: int = FPS) -> np.ndarray:
    """float32 ``(frames, 6)``: minimum-jerk moves between random waypoints."""
    rng = np.random.default_rng(seed)
    count = int(frames / fps / _SEGMENT_S) + 2
    waypoints = _CENTRE + rng.uniform(-1.0, 1.0, (count, 6)) * _SPAN
    t = np.arange(frames) / fps
    knots = np.arange(count) * _SEGMENT_S
    out = np.empty((frames, 6))
    for i in range(count - 1):
        inside = (t >= knots[i]) & (t <= knots[i + 1])
        s = (t[inside] - knots[i]) / _SEGMENT_S
        s = 10 * s**3 - 15 * s**4 + 6 * s**5
        out[inside] = waypoints[i] + (waypoints[i + 1] - waypoints[i]) * s[:, None]
    return out.astype(np.float32)


def make_twin(fps: int = FPS) -> Twin:
    """A twin without cameras, cube parked out of reach, stepping ``fps`` in whole steps.

    The physics step is the one ``hilrec replay`` picks for a dataset that does not state one
    (the twin's 5 ms when it divides the frame, e.g. 4.76 ms at 30 fps), as a recorder with its
    own clock would have run.
    """
    from hilrec.daemon.replay.engine import timestep_for
    from hilrec.sim.scene import SceneConfig
    from hilrec.sim.twin import Twin

    # The cube is parked out of reach: these recordings are about the arm only.
    scene = replace(
        SceneConfig(),
        timestep=timestep_for(fps, None)[0],
        cube_x_range=(0.55, 0.55),
        cube_y_range=(0.35, 0.35),
        cube_yaw_range=(0.0, 0.0),
    )
    return Twin(fps=fps, cameras=(), scene=scene)


def record(spec: RecordingSpec, twin: Twin) -> Episode:
    """One episode on ``twin`` as a hardware recorder would have written it.

    A missed tick slot (the recorder was late by a whole period) is physics without a row: the
    follower holds the last goal for that frame, and the row after it says which slot it is.
    """
    leader = leader_path(spec.seed, spec.frames, twin.fps)
    start = leader[0] if spec.start is None else np.array(spec.start, dtype=np.float32)
    twin.reset(spec.seed, arm_units=start.tolist())
    frozen_index = JOINT_NAMES.index(spec.frozen.joint) if spec.frozen else None
    held: np.ndarray | None = None
    servo_goal = start.astype(np.float64)
    step_cap = None if spec.max_speed_deg_s is None else spec.max_speed_deg_s / twin.fps
    missed = dict(spec.missed_slots)
    states, actions, slots = [], [], []
    slot = -1
    for t in range(spec.frames):
        for _ in range(missed.get(t, 0)):
            twin.step_frame()
            slot += 1
        slot += 1
        slots.append(slot)
        state = twin.observe()
        action = leader[t]
        goal = leader[max(0, t - spec.latency_frames)].copy()
        if spec.frozen is not None and t >= spec.frozen.from_frame:
            if held is None:
                held = state.copy()
            goal[frozen_index] = held[frozen_index]
        if step_cap is not None:
            servo_goal = servo_goal + np.clip(goal - servo_goal, -step_cap, step_cap)
            goal = servo_goal.astype(np.float32)
        twin.command(goal)
        twin.step_frame()
        states.append(state)
        actions.append(action)
    state_col = np.array(states, dtype=np.float32)
    if spec.obs_shift_frames:
        k = spec.obs_shift_frames
        state_col = np.concatenate([np.repeat(state_col[:1], k, axis=0), state_col[:-k]])
    return Episode(
        spec=spec,
        action=np.array(actions, dtype=np.float32),
        state=state_col,
        tick_slot=np.array(slots, dtype=np.int64) if spec.keep_slots else None,
    )


class FaultyMotion:
    """The emulated follower's twin motion, with the faults of a real follower and a clock choice.

    - ``latency_s``: every goal reaches the joints that late (a queue between the two arms);
    - ``jam_joint``: after :meth:`jam` that joint's servo gets no goal (it holds where it is, as
      the emulator's motion models do for a servo without torque) while its reading stays
      truthful: the servo has stopped responding to commands.

    The emulator hands the motion the wall clock. With ``virtual_period`` the motion runs on the
    recorder's tick clock instead (:meth:`set_tick`: tick ``k`` is mid-way through frame ``k``),
    so the twin steps exactly one frame per recorded row however loaded the machine is; every
    packet still crosses the pty and the servo registers. Without it, the motion stands still
    until :meth:`start_clock` (so opening the follower never waits for physics catching up on the
    wall clock) and then remembers when the emulator first advanced it, so a wall-clock recorder
    can put its ticks mid-frame.
    """

    def __init__(
        self,
        inner: ArmMotion,
        *,
        jam_joint: str | None = None,
        latency_s: float = 0.0,
        virtual_period: float | None = None,
    ) -> None:
        import collections
        import threading

        self._inner = inner
        self._joint = JOINT_NAMES.index(jam_joint) if jam_joint is not None else None
        self._jammed = threading.Event()
        self._latency = latency_s
        self._queue: collections.deque[tuple[float, list[float | None]]] = collections.deque()
        self._effective: list[float | None] | None = None
        self._period = virtual_period
        self._tick = 0
        self._clock_running = virtual_period is not None
        self.first_advance: float | None = None

    def jam(self) -> None:
        self._jammed.set()

    def start_clock(self) -> None:
        """Wall-clock mode: let time run from the next packet on."""
        self._clock_running = True

    def set_tick(self, tick: int) -> None:
        """Virtual clock: the recorder's tick about to start (before it sends any packet)."""
        self._tick = tick

    def advance(self, now: float, targets: Sequence[float | None]) -> None:
        if not self._clock_running:
            return
        if self._period is not None:
            # Power-up is time 0; tick k is half a frame into frame k, far from any boundary the
            # emulator's int((now - t0) / period) could round the wrong way.
            now = 0.0 if self.first_advance is None else (self._tick + 0.5) * self._period
        if self.first_advance is None:
            self.first_advance = now
        self._queue.append((now, list(targets)))
        while self._queue and self._queue[0][0] <= now - self._latency:
            self._effective = self._queue.popleft()[1]
        goals = list(self._effective) if self._effective is not None else [None] * len(targets)
        if self._joint is not None and self._jammed.is_set():
            goals[self._joint] = None
        self._inner.advance(now, goals)

    def next_due(self) -> float | None:
        """Wall-clock mode: when the emulator should step the next frame while the bus is idle
        (as it does for its own twin motion). The tick clock never steps between packets."""
        if self._period is not None or not self._clock_running:
            return None
        return getattr(self._inner, "next_due", lambda: None)()

    def actual(self) -> np.ndarray:
        return self._inner.actual()

    def velocity(self) -> np.ndarray:
        return self._inner.velocity()

    def close(self) -> None:
        self._inner.close()


def record_operator(seed: int, twin: Twin) -> Episode:
    """A pick-and-place episode: the sim's scripted operator on the leader, the cube in the
    follower's scene (a default-scene twin), so the follower's jaw closes on the cube."""
    from hilrec.sim.operator import ScriptedOperator

    start = twin.reset(seed)
    operator = ScriptedOperator(seed, fps=twin.fps)
    operator.reset(start)
    states, actions = [], []
    for t in range(operator.num_frames):
        state = twin.observe()
        actions.append(twin.command(operator.act(t, state)))
        twin.step_frame()
        states.append(state)
    return Episode(
        spec=RecordingSpec(seed=seed, frames=operator.num_frames),
        action=np.array(actions, dtype=np.float32),
        state=np.array(states, dtype=np.float32),
    )


def record_emulated(
    spec: RecordingSpec, workdir: Path, *, fps: int = FPS, settle_frames: int = 10, realtime: bool = False
) -> Episode:
    """One episode through the emulated follower: pty, STS3215 registers, SO101Follower.

    The follower's motion is a twin (cube parked, as in :func:`make_twin`); goals and readings
    travel as servo ticks through the emulated calibration.

    ``realtime=False`` (the tests) runs the emulated physics on the recorder's tick clock (see
    :class:`FaultyMotion`): deterministic and as fast as the pty answers. ``realtime=True`` paces
    ticks on the wall clock at ``fps``, as the daemon does; the emulator then steps its twin a
    whole frame each time a frame boundary of its own clock has passed, so the ticks start half a
    frame after a boundary (had a boundary fallen between the read and the goal write, every goal
    would act a frame late: a real one-frame lag, which the check would report). Scheduling
    jitter on a loaded machine still moves single goals by a frame: that is what real timing
    looks like, and what the thresholds were measured on.

    A servo that stops answering (``unresponsive``: the emulator's ``missing`` fault) fails the
    follower's sync read; as hilrec's loop does, the row then repeats the last good observation
    and is flagged FOLLOWER_FAILED, and the goals are still written. On the tick clock a read
    that fails before then was the host's doing, not the arm's, and is asked again.
    """
    from hilrec.daemon.control.clock import TickPacer
    from hilrec.daemon.dataset import FrameFlag
    from hilrec.daemon.errors import BusError
    from hilrec.daemon.so101 import MOTORS, Role
    from hilrec.drivers.arm import FollowerConfig, SO101Follower
    from hilrec.drivers.emulated.emulator import EmulatedArm, EmulatorConfig
    from hilrec.drivers.emulated.faults import Fault
    from hilrec.drivers.emulated.motion import MechanicalFrame, TwinMotion
    from hilrec.sim.units import emulated_calibration

    if spec.latency_frames or spec.obs_shift_frames:
        raise ValueError(
            "on the emulated path latency is latency_ms; the observation shift is a synthetic-recording fault"
        )
    leader = leader_path(spec.seed, spec.frames, fps)
    twin = make_twin(fps)
    twin.reset(spec.seed, arm_units=leader[0])
    frame = MechanicalFrame.from_sim()
    calibration = write_calibration(workdir / f"follower-{spec.seed}.json", emulated_calibration())
    period = 1.0 / fps
    motion = FaultyMotion(
        TwinMotion(frame, twin=twin),
        latency_s=spec.latency_ms / 1000.0,
        jam_joint=spec.frozen.joint if spec.frozen is not None else None,
        virtual_period=None if realtime else period,
    )
    arm = EmulatedArm(EmulatorConfig(role=Role.FOLLOWER, calibration=calibration), motion=motion, frame=frame)
    states, actions, flags = [], [], []
    with served(arm), SO101Follower(FollowerConfig(port=arm.port, calibration=calibration)) as follower:
        pacer = TickPacer(period, realtime=realtime)
        if realtime:
            motion.start_clock()
            follower.get_observation()  # the first packet on the running clock sets its origin
            assert motion.first_advance is not None
            now = time.monotonic()
            mid_frame = (
                motion.first_advance + (math.floor((now - motion.first_advance) / period) + 1.5) * period
            )
            while time.monotonic() < mid_frame:
                time.sleep(max(0.0, mid_frame - time.monotonic()) / 2)

        def write(goal: np.ndarray) -> np.ndarray:
            handled = arm.packets_handled
            sent = follower.send_action(goal).sent
            # A sync write gets no reply: on the virtual clock the next tick must not start
            # before the emulator has taken this goal, or the goal would act a frame late.
            if not realtime and not arm.wait_handled(handled + 1):
                raise TimeoutError("the emulated follower did not take a goal within 5 s")
            return sent

        silent = False

        def observe() -> np.ndarray:
            # On the tick clock a reading is fixed by the tick, so a read that the host timed out
            # (a loaded machine held the pty's bytes past the reply timeout) is asked again: only
            # the injected silence may fail a read and flag its row.
            for _ in range(0 if realtime or silent else LOADED_READ_ATTEMPTS - 1):
                with contextlib.suppress(BusError):
                    return follower.get_observation().values
            return follower.get_observation().values

        for tick in range(settle_frames):  # the person holds the leader still before recording
            motion.set_tick(tick)
            pacer.next_tick()
            write(leader[0])
        motion.set_tick(settle_frames)
        last_good = observe()
        for t in range(spec.frames):
            motion.set_tick(settle_frames + t)
            pacer.next_tick()
            if spec.frozen is not None and t == spec.frozen.from_frame:
                motion.jam()
            if spec.unresponsive is not None and t == spec.unresponsive.from_frame:
                arm.inject(Fault(kind="missing", servo_id=MOTORS[spec.unresponsive.joint][0]))
                silent = True
            if spec.held_replies is not None and t == spec.held_replies[0]:
                arm.inject(Fault(kind="late", servo_id=MOTORS[JOINT_NAMES[0]][0], count=spec.held_replies[1]))
            flag = 0
            try:
                last_good = observe()
            except BusError:
                flag = int(FrameFlag.FOLLOWER_FAILED)
            states.append(last_good)
            actions.append(write(leader[t]))
            flags.append(flag)
    return Episode(
        spec=spec,
        action=np.array(actions, dtype=np.float32),
        state=np.array(states, dtype=np.float32),
        frame_flags=np.array(flags, dtype=np.uint32),
    )


def to_m100_100(values: np.ndarray, calibration: dict[str, dict[str, int]]) -> np.ndarray:
    """Degrees body columns -> LeRobot's RANGE_M100_100 under ``calibration`` (gripper kept)."""
    out = np.asarray(values, dtype=np.float64).copy()
    for j, name in enumerate(JOINT_NAMES[:-1]):
        cal = calibration[name]
        ticks_from_mid = out[:, j] * 4095 / 360
        value = ticks_from_mid / (cal["range_max"] - cal["range_min"]) * 200
        out[:, j] = -value if cal["drive_mode"] else value  # LeRobot's drive_mode negates M100
    return out.astype(np.float32)


def write_with_lerobot(
    root: Path,
    episodes: Sequence[Episode],
    *,
    fps: int = FPS,
    body_units: str = "degrees",
    calibration: dict[str, dict[str, int]] | None = None,
) -> Path:
    """Write with LeRobot's own ``LeRobotDataset`` and nothing beside it (no hilrec metadata)."""
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    features = {k: {**v, "shape": tuple(v["shape"])} for k, v in so101_features().items()}
    dataset = LeRobotDataset.create(
        repo_id=f"test/{root.name}",
        fps=fps,
        features=features,
        root=root,
        robot_type=ROBOT_TYPE,
        use_videos=False,
    )
    for ep in episodes:
        action, state = ep.action, ep.state
        if body_units == "m100_100":
            assert calibration is not None
            action, state = to_m100_100(action, calibration), to_m100_100(state, calibration)
        for a, s in zip(action, state, strict=True):
            dataset.add_frame({ACTION_KEY: a, STATE_KEY: s, "task": TASK})
        dataset.save_episode()
    dataset.finalize()
    return root


def write_native(root: Path, episodes: Sequence[Episode], twin: Twin, *, fps: int = FPS) -> Path:
    """Write with hilrec's native writer, plus the dataset sidecar a hilrec recorder writes."""
    from hilrec.daemon.dataset.writer.dataset_writer import DatasetWriter

    with DatasetWriter.create(root, fps=fps, features=so101_features(), robot_type=ROBOT_TYPE) as writer:
        for ep in episodes:
            for a, s in zip(ep.action, ep.state, strict=True):
                writer.add_frame({ACTION_KEY: a, STATE_KEY: s, "task": TASK})
            arrays = {
                name: value
                for name, value in (("frame_flags", ep.frame_flags), ("tick_slot", ep.tick_slot))
                if value is not None
            }
            writer.save_episode(sidecar={"recording": _describe(ep.spec)}, arrays=arrays or None)
    add_hilrec_metadata(root, twin)
    return root


def _describe(spec: RecordingSpec) -> dict[str, Any]:
    return {
        "seed": spec.seed,
        "latency_frames": spec.latency_frames,
        "latency_ms": spec.latency_ms,
        "obs_shift_frames": spec.obs_shift_frames,
        "frozen": None
        if spec.frozen is None
        else {"joint": spec.frozen.joint, "from_frame": spec.frozen.from_frame},
        "unresponsive": None
        if spec.unresponsive is None
        else {"joint": spec.unresponsive.joint, "from_frame": spec.unresponsive.from_frame},
    }


def add_hilrec_metadata(root: Path, twin: Twin) -> None:
    """The dataset sidecar a hilrec recorder writes: units mapping and physics."""
    from hilrec.daemon.dataset.format.sidecar import update_dataset_sidecar
    from hilrec.sim.units import units_mapping

    update_dataset_sidecar(root, {"units": units_mapping(twin.units), "physics": twin.physics_info()})


def write_calibration(path: Path, calibration: dict[str, dict[str, int]]) -> Path:
    path.write_text(json.dumps(calibration, indent=4))
    return path
