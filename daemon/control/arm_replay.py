"""``hilrec replay ROOT --on-arm``: play one recorded episode back on the follower, as
``lerobot-replay`` does, and measure how the arm follows it.

Two phases, both on the absolute-deadline pacer (:class:`hilrec.daemon.control.clock.TickPacer`)
at the dataset's fps, every goal through the follower's :class:`hilrec.daemon.goals.GoalLimits`
(the calibrated range, ``max_relative_target``):

1. the approach: from where the arm stands, a straight line to the episode's first recorded state
   at no more than ``ramp_speed`` units per second on any joint, then held until every joint is
   within ``start_tolerance`` of it (or ``settle_timeout_s`` passes: refused, nothing played);
2. the playback: each tick reads Present_Position (the measurement compared with the recorded
   ``observation.state`` of that frame, read at the same point of the recorder's tick), then sends
   the recorded ``action``. The recorded action is what was executed, so the clamp should change
   nothing on a sane dataset; each tick it did change is counted.

A Ctrl-C is only noted and ends the run at the next tick edge, so no bus transaction is cut in
half; the caller's stack turns the torque off whatever happened.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from hilrec.daemon.control.clock import TickPacer, TickTimes
from hilrec.daemon.dataset import LATE_BUDGET_S, FrameFlag, load_dataset_sidecar, reader
from hilrec.daemon.errors import BusError, DeviceError, ReplayError
from hilrec.daemon.replay.check import column_order
from hilrec.daemon.replay.units import resolve_units
from hilrec.daemon.so101 import ACTION_KEY, JOINT_NAMES, STATE_KEY, BodyMode

if TYPE_CHECKING:
    from hilrec.drivers.arm import SO101Follower

log = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True)
class ArmReplayOptions:
    ramp_speed: float = 30.0  # units per second on every joint during the approach
    start_tolerance: float = 3.0  # units: every joint this close to the first state before playing
    settle_timeout_s: float = 3.0  # after the ramp, how long the arm may take to get there
    max_failed_ticks: int = 5  # failed reads in a row before the arm counts as lost
    spin_s: float = 0.0005  # the pacer's spin before each deadline


@dataclass(frozen=True)
class RecordedEpisode:
    """One episode's columns in SO-101 joint order, in the units the arm speaks."""

    root: Path
    index: int
    fps: int
    action: np.ndarray  # float32 (n, 6)
    state: np.ndarray  # float32 (n, 6)
    task: str
    body: BodyMode

    @property
    def length(self) -> int:
        return int(self.action.shape[0])


def load_recorded(
    root: Path,
    index: int,
    *,
    arm_body: BodyMode,
    units_flag: str | None = None,
    calibration_flag: Path | None = None,
) -> RecordedEpisode:
    """Episode ``index`` of ``root``, refused (ReplayError naming what) unless the arm can play it."""
    info = reader.load_info(root)
    fps = int(info["fps"])
    lengths = {int(e["episode_index"]): int(e["length"]) for e in reader.load_episodes(root)}
    if index not in lengths:
        raise ReplayError(
            f"--episode {index}: {root} has {len(lengths)} episode(s), indices {min(lengths)}..{max(lengths)}"
            if lengths
            else f"--episode {index}: {root} has no episodes"
        )
    action_order = column_order(info, ACTION_KEY)
    state_order = column_order(info, STATE_KEY)
    units = resolve_units(
        root, load_dataset_sidecar(root), units_flag=units_flag, calibration_flag=calibration_flag
    )
    if units.body != arm_body:
        raise ReplayError(
            f"{root}: the body joints are recorded in {units.body} ({units.source}) but the "
            f"follower speaks {arm_body} (config key follower.body_mode)"
        )
    columns = reader.read_episode(root, index, columns=[ACTION_KEY, STATE_KEY, "task_index"])
    action = np.asarray(columns[ACTION_KEY], dtype=np.float32)[:, action_order]
    state = np.asarray(columns[STATE_KEY], dtype=np.float32)[:, state_order]
    if action.shape[0] == 0:
        raise ReplayError(f"{root}: episode {index} has no frames")
    for key, values in ((ACTION_KEY, action), (STATE_KEY, state)):
        bad = np.flatnonzero(~np.isfinite(values).all(axis=1))
        if bad.size:
            raise ReplayError(f"{root}: episode {index} '{key}' is not finite at frame {int(bad[0])}")
    tasks = reader.load_tasks(root)
    task = tasks.get(int(columns["task_index"][0]), "replay")
    return RecordedEpisode(
        root=root, index=index, fps=fps, action=action, state=state, task=task, body=units.body
    )


@dataclass
class ArmRun:
    """What the arm was told and what it read, tick by tick, in both phases."""

    start: np.ndarray  # float32 (6,): where the arm stood
    target: np.ndarray  # float32 (6,): the episode's first state, clamped to the range
    ramp_goal: list[np.ndarray] = field(default_factory=list)
    ramp_present: list[np.ndarray] = field(default_factory=list)
    reached: np.ndarray | None = None  # the reading the playback started from
    measured: list[np.ndarray] = field(default_factory=list)  # last good reading of each tick
    sent: list[np.ndarray] = field(default_factory=list)
    flags: list[int] = field(default_factory=list)
    times: list[TickTimes] = field(default_factory=list)
    clamped: list[bool] = field(default_factory=list)
    interrupted: str | None = None  # "approach" or "playback": where a Ctrl-C stopped it
    fault: str | None = None  # the device error that ended the playback early

    @property
    def played(self) -> int:
        return len(self.sent)


class _Reader:
    """Reads the follower each tick; a failed read keeps the last good one, and too many failed
    in a row mean the arm is lost (DeviceError)."""

    def __init__(self, arm: SO101Follower, max_failed: int) -> None:
        self.arm, self.max_failed = arm, max_failed
        self.last = arm.get_observation().values
        self.failed_in_row = 0

    def read(self) -> tuple[np.ndarray, int]:
        try:
            reading = self.arm.get_observation()
        except BusError as exc:
            self.failed_in_row += 1
            if self.failed_in_row >= self.max_failed:
                raise DeviceError(f"{self.arm!r}: {self.failed_in_row} reads in a row failed: {exc}") from exc
            return self.last, int(FrameFlag.FOLLOWER_FAILED)
        self.failed_in_row = 0
        self.last = reading.values
        return self.last, int(FrameFlag.FOLLOWER_RETRIED) if reading.retries else 0


def play_on_arm(
    arm: SO101Follower, episode: RecordedEpisode, options: ArmReplayOptions, stop: list[int]
) -> ArmRun:
    """Approach the first state, then play the actions; ``stop`` non-empty ends it at a tick edge."""
    period = 1.0 / episode.fps
    reading = _Reader(arm, options.max_failed_ticks)
    limits = arm.limits
    target, _ = limits.clamp(episode.state[0], present=None if limits.max_step is None else episode.state[0])
    run = ArmRun(start=reading.last.copy(), target=target)
    pacer = TickPacer(period, spin_s=options.spin_s)
    if not _approach(arm, run, reading, pacer, options, period, stop):
        run.interrupted = "approach"
        return run
    run.reached = reading.last.copy()
    log.info(
        "playing episode %d of %s: %d frames at %d fps",
        episode.index,
        episode.root,
        episode.length,
        episode.fps,
    )
    for k in range(episode.length):
        if stop:
            run.interrupted = "playback"
            break
        try:
            _play_tick(arm, run, reading, pacer, episode.action[k])
        except DeviceError as exc:  # the arm is lost: what was played is still reported and kept
            run.fault = f"{type(exc).__name__} at frame {k}: {exc}"
            log.error("%s", run.fault)
            break
    return run


def _play_tick(
    arm: SO101Follower, run: ArmRun, reading: _Reader, pacer: TickPacer, action: np.ndarray
) -> None:
    tick = pacer.next_tick()
    present, flag = reading.read()
    tick.observed = tick.leader_read = time.monotonic()
    sent = arm.send_action(action, present=present)
    tick.written = tick.end = time.monotonic()
    if sent.clamped:
        flag |= int(FrameFlag.CLAMPED)
    if tick.late_s > LATE_BUDGET_S:
        flag |= int(FrameFlag.LATE)
    if tick.skipped:
        flag |= int(FrameFlag.SKIPPED)
    run.measured.append(present)
    run.sent.append(sent.sent)
    run.clamped.append(sent.clamped)
    run.flags.append(flag)
    run.times.append(tick)


def _approach(
    arm: SO101Follower,
    run: ArmRun,
    reading: _Reader,
    pacer: TickPacer,
    options: ArmReplayOptions,
    period: float,
    stop: list[int],
) -> bool:
    """The bounded-speed line to ``run.target``, then the hold until it is reached. False: a
    Ctrl-C came first. DeviceError: the arm did not get there in time."""
    distance = np.abs(run.target.astype(np.float64) - run.start)
    steps = max(1, math.ceil(float(distance.max()) / (options.ramp_speed * period)))
    settle_ticks = max(1, math.ceil(options.settle_timeout_s / period))
    for i in range(1, steps + 1 + settle_ticks):
        if stop:
            return False
        pacer.next_tick()
        present, _ = reading.read()
        if i > steps and np.all(np.abs(present - run.target) <= options.start_tolerance):
            return True
        s = min(1.0, i / steps)
        goal = run.start + (run.target.astype(np.float64) - run.start) * s
        run.ramp_present.append(present)
        run.ramp_goal.append(arm.send_action(goal, present=present).sent)
    present = reading.last
    far = np.abs(present - run.target)
    worst = int(np.argmax(far))
    raise DeviceError(
        f"{arm!r} did not reach the episode's first state within "
        f"{options.settle_timeout_s:g} s of the approach: {JOINT_NAMES[worst]} reads "
        f"{float(present[worst]):.2f}, asked {float(run.target[worst]):.2f} "
        f"(tolerance {options.start_tolerance:g}); nothing was played"
    )
