"""What a rollout records beside the dataset, and the expert's takeover rule.

The dataset's ``action`` is what was sent, whoever sent it, and the per-frame ``intervention``
feature (bool ``[1]``, as LeRobot 0.6.1's ``lerobot-rollout`` writes it) says a human (or the
scripted expert standing in for one) had the arm. Beside the dataset, per frame, in the episode
npz (:meth:`RolloutLog.arrays`):

- ``policy_action`` float32 (n, 6): the goal the policy proposed, on every frame, the human's
  too (NaN where it had none due: a starved tick);
- ``control_source`` uint8 (n,): :class:`ControlSource` codes (:data:`SOURCE_CODES`);
- ``action_age_ticks`` int32 (n,): ticks since the observation the policy's goal came from, -1
  with none; ``chunk_fresh`` bool (n,): the first frame using its chunk; ``inference_latency_s``
  float64 (n,): the chunk's inference time, NaN with none;
- ``expert_action`` float32 (n, 6), in the twin: the expert's own goal at every frame, also
  those the policy drove (DAgger labels for the states the policy visited).

The sidecar (:meth:`RolloutLog.summary`) holds each switch (frame, new source, the goal step it
took, the per-tick clamp), the takeover count, the human share of frames, starved and refused
counts and the inference latency's p50/p99.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Final

import numpy as np

from hilrec.daemon.so101 import NUM_JOINTS

INTERVENTION_KEY: Final[str] = "intervention"


def intervention_feature() -> dict[str, Any]:
    """LeRobot 0.6.1's ``intervention`` column: ``np.array([True], dtype=bool)`` per frame."""
    return {"dtype": "bool", "shape": [1], "names": None}


class ControlSource(StrEnum):
    """Who sent a frame's action."""

    POLICY = "policy"
    HUMAN = "human"


SOURCE_CODES: Final[dict[ControlSource, int]] = {ControlSource.POLICY: 0, ControlSource.HUMAN: 1}


class TakeoverMode(StrEnum):
    """What takes the arm from the policy (``--takeover``)."""

    KEY = "key"  # space in ``hilrec rollout``, ``hilrec ctl takeover``
    LEADER = "leader"  # the key, or the leader moved away from the follower by a threshold
    EXPERT = "expert"  # the scripted operator, when the policy strays from its command
    OFF = "off"  # the policy keeps the arm


class RecordMode(StrEnum):
    """What a rollout records (``hilrec rollout --record``)."""

    ALL = "all"  # every frame of the take, the policy's and the human's, labelled by ``intervention``
    # Only the correction windows, one episode each (LeRobot's ``record_autonomous=False``): the
    # policy drives between them unrecorded.
    CORRECTIONS = "corrections"


class ExpertWatch:
    """True once the policy's goal has strayed from the expert's by more than ``threshold``
    (LeRobot units, the largest joint's difference) for ``ticks`` ticks in a row."""

    def __init__(self, *, threshold: float, ticks: int) -> None:
        self.threshold = threshold
        self.ticks = ticks
        self._streak = 0

    def reset(self) -> None:
        self._streak = 0

    def strayed(self, policy_goal: np.ndarray | None, expert_goal: np.ndarray) -> bool:
        if policy_goal is None:
            gap = self.threshold + 1.0  # starved: the policy is not following the expert either
        else:
            gap = float(np.max(np.abs(np.asarray(policy_goal, np.float64) - expert_goal)))
        self._streak = self._streak + 1 if gap > self.threshold else 0
        return self._streak >= self.ticks


@dataclass(frozen=True, kw_only=True)
class Switch:
    frame: int
    to: ControlSource
    goal_step: float  # largest joint change of the sent goal from the frame before
    max_step: float | None  # the per-tick clamp in force

    def to_dict(self) -> dict[str, Any]:
        return {
            "frame": self.frame,
            "to": str(self.to),
            "goal_step": self.goal_step,
            "max_step": self.max_step,
        }


_NONE6 = np.full(NUM_JOINTS, np.nan, dtype=np.float32)


@dataclass
class RolloutLog:
    """One episode's per-frame rollout record; see the module's text."""

    policy: str
    max_step: float | None
    proposed: list[np.ndarray] = field(default_factory=list)
    sources: list[int] = field(default_factory=list)
    ages: list[int] = field(default_factory=list)
    fresh: list[bool] = field(default_factory=list)
    latency: list[float] = field(default_factory=list)
    expert: list[np.ndarray] = field(default_factory=list)
    switches: list[Switch] = field(default_factory=list)
    starved: int = 0
    refused: int = 0
    last_refusal: str | None = None
    _last_sent: np.ndarray | None = None
    _pending_switch: ControlSource | None = None

    def add(
        self,
        *,
        source: ControlSource,
        proposed: np.ndarray | None,
        age: int,
        fresh: bool,
        latency_s: float,
        sent: np.ndarray,
        expert: np.ndarray | None = None,
    ) -> None:
        """One frame: who drove, what the policy proposed, and the goal actually sent."""
        frame = len(self.sources)
        if self.sources and SOURCE_CODES[source] != self.sources[-1]:
            step = 0.0
            if self._last_sent is not None:
                step = float(np.max(np.abs(sent.astype(np.float64) - self._last_sent.astype(np.float64))))
            self.switches.append(Switch(frame=frame, to=source, goal_step=step, max_step=self.max_step))
        self.proposed.append(_NONE6 if proposed is None else np.asarray(proposed, np.float32))
        self.sources.append(SOURCE_CODES[source])
        self.ages.append(age)
        self.fresh.append(fresh)
        self.latency.append(latency_s)
        if expert is not None:
            self.expert.append(np.asarray(expert, np.float32))
        self._last_sent = np.asarray(sent, np.float32)

    @property
    def frames(self) -> int:
        return len(self.sources)

    def intervention(self) -> np.ndarray:
        return np.asarray(self.sources, dtype=np.uint8) == SOURCE_CODES[ControlSource.HUMAN]

    def arrays(self) -> dict[str, np.ndarray]:
        out: dict[str, np.ndarray] = {
            "policy_action": np.stack(self.proposed).astype(np.float32)
            if self.proposed
            else np.zeros((0, NUM_JOINTS), np.float32),
            "control_source": np.asarray(self.sources, dtype=np.uint8),
            "action_age_ticks": np.asarray(self.ages, dtype=np.int32),
            "chunk_fresh": np.asarray(self.fresh, dtype=bool),
            "inference_latency_s": np.asarray(self.latency, dtype=np.float64),
        }
        if self.expert and len(self.expert) == self.frames:
            out["expert_action"] = np.stack(self.expert).astype(np.float32)
        return out

    def summary(self) -> dict[str, Any]:
        human = int(self.intervention().sum())
        fresh = np.asarray(self.latency, dtype=np.float64)[np.asarray(self.fresh, dtype=bool)]
        fresh = fresh[np.isfinite(fresh)]
        return {
            "policy": self.policy,
            "frames": self.frames,
            "takeovers": sum(s.to == ControlSource.HUMAN for s in self.switches),
            "handbacks": sum(s.to == ControlSource.POLICY for s in self.switches),
            "human_share": human / self.frames if self.frames else 0.0,
            "switches": [s.to_dict() for s in self.switches],
            "largest_switch_step": max((s.goal_step for s in self.switches), default=None),
            "max_relative_target": self.max_step,
            "starved_ticks": self.starved,
            "refused_answers": self.refused,
            "last_refusal": self.last_refusal,
            "inference_latency_s": {
                "chunks": int(fresh.size),
                "p50": float(np.percentile(fresh, 50)) if fresh.size else None,
                "p99": float(np.percentile(fresh, 99)) if fresh.size else None,
            },
            "control_source_codes": {str(k): v for k, v in SOURCE_CODES.items()},
            "arrays": sorted(self.arrays()),
        }


class Outcome(StrEnum):
    """A rollout take's outcome, as the operator marked it (``s`` / ``f`` in ``hilrec rollout``)
    or the twin measured it."""

    SUCCESS = "success"
    FAILURE = "failure"


def episode_outcome(meta: Mapping[str, Any]) -> Outcome | None:
    """An episode sidecar's outcome: the rollout's own (the twin's ``hilrec record --policy``),
    else the operator's mark (``success_reported`` beside a measured one), else ``success``;
    None when nobody said."""
    rollout = meta.get("rollout")
    said = rollout.get("outcome") if isinstance(rollout, Mapping) else None
    if said in (Outcome.SUCCESS, Outcome.FAILURE):
        return Outcome(said)
    value = meta.get("success_reported", meta.get("success"))
    if isinstance(value, bool):
        return Outcome.SUCCESS if value else Outcome.FAILURE
    return None


def has_corrections(meta: Mapping[str, Any]) -> bool:
    """Whether a human (or the scripted expert) drove any frame of the episode."""
    rollout = meta.get("rollout")
    if not isinstance(rollout, Mapping):
        return False
    return float(rollout.get("human_share") or 0.0) > 0.0 or int(rollout.get("takeovers") or 0) > 0
