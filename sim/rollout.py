"""A policy drives the twin, and the scripted operator takes over when it strays (DAgger).

``hilrec record --sim --policy SPEC --takeover expert``: each frame the policy is asked in line
(so an episode is deterministic and runs faster than real time; its chunks are indexed by frame
exactly as the daemon indexes them by tick, :mod:`hilrec.daemon.policy.driver`), its goal is
clamped by ``max_relative_target`` around the observed joints through the same
:class:`~hilrec.daemon.goals.GoalLimits` as every goal, and the twin executes it. The scripted
operator watches as the expert: when the policy's goal strays from the operator's by more than
``threshold`` for ``ticks`` frames, the operator takes the arm, re-planning the rest of the
episode from the goal sent last, so the switch is one smooth step.

The frame loop is :mod:`hilrec.sim.episode`'s (observe, render, command, step), and the action
recorded is the one executed, so ``hilrec check --replay`` replays a rollout bit for bit like
any other episode. Beside the dataset: :class:`~hilrec.daemon.policy.record.RolloutLog`, with the
expert's own goal on every frame (``expert_action``: labels for the states the policy visited).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from hilrec.daemon.dataset import FrameSink
from hilrec.daemon.goals import GoalLimits
from hilrec.daemon.policy.driver import PolicyDriver
from hilrec.daemon.policy.record import (
    INTERVENTION_KEY,
    ControlSource,
    ExpertWatch,
    RolloutLog,
    TakeoverMode,
)
from hilrec.daemon.so101 import ACTION_KEY, IMAGE_PREFIX, NUM_JOINTS, STATE_KEY
from hilrec.sim.episode import (
    ContactTally,
    act_and_step,
    operator_action,
    outcome_of,
    push_schedule,
    pushes_by_frame,
)
from hilrec.sim.operator import ScriptedOperator, cube_yaw
from hilrec.sim.twin import Twin

TASK_KEY = "task"


@dataclass(frozen=True, kw_only=True)
class RolloutConfig:
    """How a policy drives the twin in ``record --sim --policy``."""

    policy: str
    takeover: TakeoverMode = TakeoverMode.EXPERT
    threshold: float = 8.0  # LeRobot units (degrees; gripper 0..100): the largest joint's gap
    ticks: int = 5  # frames in a row beyond the threshold before the expert takes over
    max_relative_target: float = 6.0  # units per frame around the observed joints, policy goals


@dataclass(frozen=True, kw_only=True)
class PolicyEpisode:
    frames: int
    log: RolloutLog
    outcome: Any
    tally: ContactTally
    pushes: list[Any]


def run_policy_episode(
    twin: Twin,
    operator: ScriptedOperator,
    sink: FrameSink,
    driver: PolicyDriver,
    rollout: RolloutConfig,
    *,
    seed: int,
    task: str,
    push_rate: float,
) -> tuple[PolicyEpisode, Any]:
    """Play one policy episode into ``sink`` (frames added, not saved; discarded on an
    exception). Returns the episode and the twin's EpisodeStart."""
    start = twin.reset(seed)
    operator.reset(start)
    pushes = push_schedule(seed, operator.num_frames, twin.fps, push_rate)
    pushes_at = pushes_by_frame(pushes)
    tally = ContactTally(twin)
    step_limit = np.full(NUM_JOINTS, rollout.max_relative_target, dtype=np.float64)
    limits = GoalLimits(twin.limits.low, twin.limits.high, step_limit)
    watch = ExpertWatch(threshold=rollout.threshold, ticks=rollout.ticks)
    log = RolloutLog(policy=driver.name, max_step=rollout.max_relative_target)
    driver.restart()
    source = ControlSource.POLICY
    last_sent: np.ndarray | None = None
    index = 0
    try:
        while index < operator.num_frames:
            observation = twin.observe()
            frame: dict[str, Any] = {STATE_KEY: observation, TASK_KEY: task}
            for camera in twin.cameras:
                frame[IMAGE_PREFIX + camera] = twin.render(camera)
            expert = operator_action(twin, operator, index, observation)
            step = driver.step(index, frame)
            if source == ControlSource.POLICY:
                log.starved += step.starved
                if (
                    rollout.takeover == TakeoverMode.EXPERT
                    and watch.strayed(step.goal, expert)
                    and _take_over(twin, operator, index, last_sent if last_sent is not None else observation)
                ):
                    source = ControlSource.HUMAN
                    expert = operator.act(index, observation)
            if source == ControlSource.POLICY:
                held = last_sent if last_sent is not None else observation
                wanted = step.goal if step.goal is not None else held
                goal, _ = limits.clamp(wanted, observation)
            else:
                goal = expert
            executed = act_and_step(twin, goal, pushes_at.get(index, ()))
            frame[ACTION_KEY] = executed
            frame[INTERVENTION_KEY] = np.array([source == ControlSource.HUMAN], dtype=bool)
            sink.add_frame(frame)
            tally.add()
            log.add(
                source=source,
                proposed=step.goal,
                age=step.age,
                fresh=step.fresh,
                latency_s=step.latency_s,
                sent=executed,
                expert=expert,
            )
            last_sent = executed
            index += 1
    except BaseException:
        sink.discard_episode()
        raise
    log.refused = driver.refused
    log.last_refusal = driver.last_refusal
    return PolicyEpisode(frames=index, log=log, outcome=outcome_of(twin), tally=tally, pushes=pushes), start


def _take_over(twin: Twin, operator: ScriptedOperator, index: int, last_goal: np.ndarray) -> bool:
    cube = twin.cube_state()
    return operator.take_over(index, last_goal, cube.position, cube_yaw(cube.quaternion))
