"""A policy drives the follower in the daemon's loop, and a person takes over and hands back.

With ``[policy] spec`` set, the rig's leader becomes a :class:`RolloutLeader`: to the loop it is
one more leader (:class:`~hilrec.daemon.control.sources.Leader`), read once per tick, that never
blocks. Each tick it feeds the policy's process the observation and the images (newest wins,
:mod:`hilrec.daemon.policy.runner`), takes the goal due from the newest chunk, and reads the
human's leader as well, so that:

- while the policy drives, its goal goes through the same :class:`~hilrec.daemon.goals.GoalLimits`
  clamp as every goal, with ``max_relative_target`` on around the present position; when none is
  due the follower holds its last goal and the tick is marked ``STARVED``; an answer refused
  (NaN, wrong shape, 1e6) is counted, marked ``POLICY_REFUSED`` and sent nowhere;
- ``takeover`` / ``handback`` (``hilrec ctl``, space in ``hilrec rollout``) switch at a tick
  edge; ``takeover = "leader"`` also switches when the leader is moved away from the follower by
  ``leader_threshold``, ``"expert"`` when the policy strays from the scripted hand; on handback
  the policy restarts from the present observation;
- after a switch the goal moves at most ``max_relative_target`` per tick from the goal sent last
  until it has caught up, so no switch jumps; each switch's step is measured from the goals
  actually sent (:class:`RolloutFollower` sees them) and recorded;
- while the policy drives, a serial leader follows the follower under a low torque
  (:mod:`hilrec.daemon.control.leader_follow`), so a takeover begins where the arm is;
- the policy's process dying is a ``PolicyError``, which the loop turns into a ``policy`` fault:
  the take is saved, the arm holds, and the fault says why.

The frame gets the ``intervention`` feature; the per-frame record and the summary go beside
the episode (:class:`~hilrec.daemon.policy.record.RolloutLog`) through :class:`RolloutHooks`.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Mapping
from concurrent.futures import Future
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from hilrec.daemon.control.leader_follow import LeaderFollow
from hilrec.daemon.control.rig import EpisodeHooks, Rig, RigFactory
from hilrec.daemon.control.sources import Follower, JointReading, Leader, WriteResult
from hilrec.daemon.dataset import FrameFlag
from hilrec.daemon.errors import PolicyError, RequestRefusedError
from hilrec.daemon.goals import GoalLimits
from hilrec.daemon.policy.chunks import PLAUSIBLE_UNITS
from hilrec.daemon.policy.driver import PolicyDriver
from hilrec.daemon.policy.record import (
    INTERVENTION_KEY,
    ControlSource,
    ExpertWatch,
    Outcome,
    RecordMode,
    RolloutLog,
    TakeoverMode,
)
from hilrec.daemon.policy.runner import ProcessRunner
from hilrec.daemon.so101 import IMAGE_PREFIX, NUM_JOINTS, STATE_KEY
from hilrec.daemon.wire.protocol import CODE_BAD_STATE

if TYPE_CHECKING:
    from hilrec.daemon.wire.policy_settings import PolicySettings

_TASK_KEY = "task"
_NO_GOAL = np.full(NUM_JOINTS, np.nan, dtype=np.float32)


@dataclass
class _Frame:
    proposed: np.ndarray | None
    age: int
    fresh: bool
    latency_s: float
    starved: bool
    sent: np.ndarray | None = None


class RolloutLeader:
    """The policy, and the human's leader beside it; see the module's text."""

    def __init__(self, human: Leader, driver: PolicyDriver, settings: PolicySettings) -> None:
        self.human = human
        self.driver = driver
        self.settings = settings
        self.mode = TakeoverMode(settings.takeover)
        self.max_step = float(settings.max_relative_target)
        step = np.full(NUM_JOINTS, self.max_step, dtype=np.float64)
        bound = np.full(NUM_JOINTS, PLAUSIBLE_UNITS, dtype=np.float32)
        self._limits = GoalLimits(-bound, bound, step)
        self._watch = ExpertWatch(threshold=settings.expert_threshold, ticks=settings.expert_ticks)
        self.follow = LeaderFollow.for_leader(
            human,
            enabled=settings.leader_follow,
            torque_limit=settings.leader_follow_torque,
            max_step=self.max_step,
        )
        self.description = f"policy {driver.name} (takeover {self.mode}); human: {human.description}"
        # Between takes the human's leader drives (the reset, as in hilrec collect); each take
        # begins with the policy, which is fed all along so its first chunk is not a cold one.
        self.source = ControlSource.HUMAN
        self._lock = threading.Lock()
        # Held through a tick and through status(), so a status is of one tick edge: never the
        # human in control with the leader still under torque, half way through a switch.
        self._tick_lock = threading.RLock()
        self._requests: list[tuple[ControlSource, Future[dict[str, Any]]]] = []
        self._images: Mapping[str, np.ndarray] = {}
        self._tick = 0
        self._frame: int | None = None
        self._frames: dict[int, _Frame] = {}
        # Who had the arm on each frame, as its intervention column says: written where the
        # column is made, so a frame whose read failed (no _Frame) still has its own hand. The
        # one place record() takes the hand from.
        self._hands: dict[int, ControlSource] = {}
        self._last_sent: np.ndarray | None = None
        self._catching_up = False
        self._leader_arrived = False
        self.takeovers = 0
        self.starved = 0
        self.fresh_chunks = 0

    # --- control thread ------------------------------------------------------------------------

    def request(self, to: ControlSource) -> Future[dict[str, Any]]:
        """Queue a switch for the next tick edge; the future resolves when it is applied."""
        if self.mode == TakeoverMode.OFF and to == ControlSource.HUMAN:
            raise RequestRefusedError("takeover is off in [policy]: the policy keeps the arm", CODE_BAD_STATE)
        future: Future[dict[str, Any]] = Future()
        with self._lock:
            self._requests.append((to, future))
        return future

    # --- loop thread ---------------------------------------------------------------------------

    def see(self, images: Mapping[str, np.ndarray]) -> None:
        self._images = images

    def begin_episode(self) -> None:
        self._frames = {}
        self._hands = {}
        if self.settings.record == RecordMode.CORRECTIONS:
            return  # an episode is one correction window: it begins with whoever has the arm
        self._switch(ControlSource.POLICY, restart=True)

    def end_episode(self) -> None:
        if self.source != ControlSource.HUMAN:  # not a takeover: the take is over
            self.source = ControlSource.HUMAN
            self._catching_up = True

    def read(self, frame_index: int | None, observation: np.ndarray) -> JointReading | None:
        with self._tick_lock:
            return self._read(frame_index, observation)

    def _read(self, frame_index: int | None, observation: np.ndarray) -> JointReading | None:
        self._apply_requests(frame_index)
        human = self.human.read(frame_index, observation)
        features = {STATE_KEY: observation, _TASK_KEY: ""}
        for name, image in self._images.items():
            features[IMAGE_PREFIX + name] = image
        try:
            step = self.driver.step(self._tick, features)  # a dead policy raises: the loop's fault
        except PolicyError:
            if self.follow is not None:  # the person gets the leader back from a dead policy
                self.follow.update(False, observation, None)
            raise
        self._tick += 1
        flags = FrameFlag(0)
        if step.refused:
            flags |= FrameFlag.POLICY_REFUSED
        if self.source == ControlSource.POLICY and self._should_take_over(step.goal, human, observation):
            self._switch(ControlSource.HUMAN)
        hold = self._last_sent if self._last_sent is not None else observation
        starved = False
        if self.source == ControlSource.POLICY:
            if step.goal is None:
                starved = True
                flags |= FrameFlag.STARVED
                goal = hold
            else:
                goal, _ = self._limits.clamp(step.goal, observation)
        elif human is None:
            flags |= FrameFlag.LEADER_STALE
            goal = hold
        else:
            goal = human.values
        goal = self._catch_up(goal)
        self.starved += starved
        self.fresh_chunks += step.fresh and frame_index is not None
        self._frame = frame_index
        if frame_index is not None:
            # Kept by frame index: a tick whose frame was not recorded is overwritten by the next.
            self._frames[frame_index] = _Frame(
                proposed=step.goal,
                age=step.age,
                fresh=step.fresh,
                latency_s=step.latency_s,
                starved=starved,
            )
        if self.follow is not None:  # the leader follows the arm while the policy has it
            self.follow.update(self.source == ControlSource.POLICY, observation, human)
        return JointReading(
            np.asarray(goal, dtype=np.float32),
            human.retries if human is not None else 0,
            flags=int(flags),
            features=self.frame_features(frame_index),
        )

    def frame_features(self, frame_index: int | None) -> dict[str, np.ndarray]:
        """The features frame ``frame_index`` gets from the rollout; the loop asks for them
        itself when the leader's read failed (a switch may have been applied before it did)."""
        if frame_index is not None:
            self._hands[frame_index] = self.source
        return {INTERVENTION_KEY: np.array([self.source == ControlSource.HUMAN], dtype=bool)}

    def note_sent(self, sent: np.ndarray) -> None:
        """What the follower was sent this tick (after every clamp)."""
        self._last_sent = np.asarray(sent, dtype=np.float32)
        if self._frame is not None and self._frame in self._frames:
            self._frames[self._frame].sent = self._last_sent

    def _apply_requests(self, frame_index: int | None) -> None:
        with self._lock:
            requests, self._requests = self._requests, []
        for to, future in requests:
            if not future.set_running_or_notify_cancel():
                continue
            already = to == self.source
            if not already:
                self._switch(to, restart=to == ControlSource.POLICY)
            future.set_result({"control": str(self.source), "already": already, "frame_index": frame_index})

    def _should_take_over(
        self, goal: np.ndarray | None, human: JointReading | None, observation: np.ndarray
    ) -> bool:
        if human is None:
            return False
        if self.mode == TakeoverMode.LEADER:
            gap = float(np.abs(human.values.astype(np.float64) - observation.astype(np.float64)).max())
            if self.follow is not None and not self._leader_arrived:
                # A following leader is on its way to the arm: its gap is not the person's doing
                # until it has once been within the threshold.
                self._leader_arrived = gap <= self.settings.leader_threshold
                return False
            return gap > self.settings.leader_threshold
        if self.mode == TakeoverMode.EXPERT:
            return self._watch.strayed(goal, human.values)
        return False

    def _switch(self, to: ControlSource, *, restart: bool = False) -> None:
        if to != self.source:
            self._catching_up = True
            self.takeovers += to == ControlSource.HUMAN
        self.source = to
        self._watch.reset()
        self._leader_arrived = False
        if restart:
            self.driver.restart()  # the policy starts again from the present observation

    def _catch_up(self, goal: np.ndarray) -> np.ndarray:
        """After a switch, step from the goal sent last by at most ``max_step`` per tick."""
        if not self._catching_up or self._last_sent is None:
            return goal
        last = self._last_sent.astype(np.float64)
        wanted = np.asarray(goal, dtype=np.float64)
        if float(np.abs(wanted - last).max()) <= self.max_step:
            self._catching_up = False
            return goal
        return (last + np.clip(wanted - last, -self.max_step, self.max_step)).astype(np.float32)

    def record(
        self, frames: int, *, success: bool | None = None
    ) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
        """The episode's rollout summary (sidecar) and per-frame arrays (npz), ``frames`` long;
        ``success`` is the operator's mark (``s`` / ``f`` in ``hilrec rollout``), None unmarked."""
        log = RolloutLog(policy=self.driver.name, max_step=self.max_step)
        previous: _Frame | None = None
        hand = ControlSource.POLICY
        for index in range(frames):
            # The hand the frame's intervention column says (kept by frame_features), whatever
            # its read did; a frame never asked for (none recorded) keeps the one before.
            hand = self._hands.get(index, hand)
            entry = self._frames.get(index)
            if entry is None or entry.sent is None:
                # A frame the loop held (a failed read): no proposal, and the goal sent before.
                entry = _Frame(
                    proposed=None,
                    age=-1,
                    fresh=False,
                    latency_s=float("nan"),
                    starved=False,
                    sent=previous.sent if previous is not None else _NO_GOAL,
                )
            previous = entry
            assert entry.sent is not None
            log.starved += entry.starved
            log.add(
                source=hand,
                proposed=entry.proposed,
                age=entry.age,
                fresh=entry.fresh,
                latency_s=entry.latency_s,
                sent=entry.sent,
            )
        log.refused = self.driver.refused
        log.last_refusal = self.driver.last_refusal
        self._frames = {}
        self._hands = {}
        outcome = None if success is None else str(Outcome.SUCCESS if success else Outcome.FAILURE)
        summary = {
            **log.summary(),
            "takeover": str(self.mode),
            "record": str(self.settings.record),
            "outcome": outcome,
        }
        return {"rollout": summary}, log.arrays()

    def status(self) -> dict[str, Any]:
        with self._tick_lock:
            return self._status()

    def _status(self) -> dict[str, Any]:
        human = self.human.status()
        return {
            **human,
            "control": str(self.source),
            "policy": self.driver.name,
            "takeover": str(self.mode),
            "takeovers": self.takeovers,
            "starved_ticks": self.starved,
            "fresh_chunks": self.fresh_chunks,
            "refused_answers": self.driver.refused,
            "last_refusal": self.driver.last_refusal,
            "policy_dead": self.driver.runner.dead,
            "leader_follow": self.follow.status() if self.follow is not None else None,
        }

    def let_go(self) -> None:
        """The leader's torque off, if it was following (every way out of the daemon)."""
        if self.follow is not None:
            self.follow.close()

    def close(self) -> None:
        self.let_go()
        self.driver.close()  # the human's leader is the rig's, closed where it was opened


class RolloutFollower:
    """The follower, telling the rollout what it was sent (the goal after every clamp)."""

    def __init__(self, follower: Follower, leader: RolloutLeader) -> None:
        self.follower = follower
        self.leader = leader
        self.description = follower.description

    def read(self) -> JointReading:
        return self.follower.read()

    def write(self, goal: np.ndarray) -> WriteResult:
        result = self.follower.write(goal)
        self.leader.note_sent(result.sent)
        return result

    def advance(self) -> None:
        self.follower.advance()

    def close(self) -> None:
        self.follower.close()


class RolloutHooks:
    """The mode's episode hooks, with the rollout's start and record added."""

    def __init__(self, hooks: EpisodeHooks, leader: RolloutLeader) -> None:
        self.hooks = hooks
        self.leader = leader

    def prepare(self, seed: int | None) -> Any:
        return self.hooks.prepare(seed)

    def begin(self, prepared: Any) -> tuple[int | None, dict[str, Any], dict[str, np.ndarray]]:
        started = self.hooks.begin(prepared)
        self.leader.begin_episode()
        return started

    def end(self) -> dict[str, Any]:
        self.leader.end_episode()
        return self.hooks.end()

    def end_record(
        self, frames: int, *, success: bool | None = None
    ) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
        return self.leader.record(frames, success=success)


def rollout_factory(factory: RigFactory, settings: PolicySettings) -> RigFactory:
    """``factory``'s rig with the policy of ``settings`` driving (its process started here)."""

    def build(stack: contextlib.ExitStack) -> tuple[Rig, EpisodeHooks]:
        # Started first: torch and the checkpoint load while the rig's devices start.
        runner = ProcessRunner(
            settings.spec,
            device=settings.device,
            threads=settings.threads,
            ready_timeout_s=settings.load_timeout_s,
            wait=False,
        )
        stack.callback(runner.close)
        rig, hooks = factory(stack)
        runner.await_ready()
        driver = PolicyDriver(runner)
        leader = RolloutLeader(rig.leader, driver, settings)
        stack.callback(leader.let_go)  # before the rig's arms close
        rig.leader = leader
        rig.follower = RolloutFollower(rig.follower, leader)
        rig.devices["policy"] = {"spec": settings.spec, "pid": runner.pid}
        return rig, RolloutHooks(hooks, leader)

    return build
