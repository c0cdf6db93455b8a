"""``[policy]``: a policy drives the follower (``hilrec rollout``, the daemon's rollout), and the
``hilrec daemon`` flags that stand in for its keys (``hilrec rollout`` passes its own to it)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING, Final

from hilrec.daemon.errors import ConfigError, FlagError
from hilrec.daemon.policy.record import RecordMode, TakeoverMode

if TYPE_CHECKING:
    from hilrec.daemon.wire.settings import DaemonSettings


@dataclass(frozen=True, kw_only=True)
class PolicySettings:
    """``[policy]``: a policy drives the follower (``hilrec rollout``); empty ``spec``: none."""

    spec: str = ""  # a LeRobot pretrained directory, or module:function, as hilrec eval takes it
    takeover: TakeoverMode = TakeoverMode.KEY
    record: RecordMode = RecordMode.ALL  # corrections: each take begins with the human's hand
    # --takeover leader: the leader this far from the follower (LeRobot units, the largest joint).
    leader_threshold: float = 15.0
    # --takeover expert (the scripted hand): the policy this far from it for expert_ticks ticks.
    expert_threshold: float = 8.0
    expert_ticks: int = 5
    # On by default for policies: a policy goal moves at most this far from the present position
    # per tick (the same GoalLimits clamp as every goal), and a switch steps no further.
    max_relative_target: float = 6.0
    # While the policy drives, a serial leader follows the follower under torque (its goal the
    # follower's measured joints, at most max_relative_target a tick from where it is), so a
    # takeover starts where the arm is; leader_follow_torque is its Torque_Limit (0.1 % of the
    # stall torque): low, so the person's hand wins against it.
    leader_follow: bool = True
    leader_follow_torque: int = 200
    device: str = "cpu"
    threads: int = 1  # torch's intra-op threads in the policy's process
    # Seconds a policy may take to load in its own process before the daemon gives up.
    load_timeout_s: float = 120.0

    def validate(self) -> None:
        for key in ("leader_threshold", "expert_threshold", "max_relative_target", "load_timeout_s"):
            if not getattr(self, key) > 0:
                raise ConfigError(key, f"must be positive, got {getattr(self, key)}")
        if self.threads < 1:
            raise ConfigError("threads", f"must be at least 1, got {self.threads}")
        if not 1 <= self.leader_follow_torque <= 1000:
            raise ConfigError(
                "leader_follow_torque",
                f"a Torque_Limit in 1..1000 (0.1 % of the stall torque), got {self.leader_follow_torque}",
            )
        if self.expert_ticks < 1:
            raise ConfigError("expert_ticks", f"must be at least 1, got {self.expert_ticks}")
        if self.record == RecordMode.CORRECTIONS and self.takeover == TakeoverMode.OFF:
            raise ConfigError("record", 'recording only the corrections needs a takeover; takeover is "off"')


# The [policy] keys ``hilrec daemon`` takes as flags (``hilrec rollout`` passes its own to it).
POLICY_FLAGS: Final[dict[str, str]] = {
    "spec": "--policy",
    "takeover": "--takeover",
    "record": "--policy-record",
}


def with_policy(
    settings: DaemonSettings, flags: Mapping[str, str] = POLICY_FLAGS, **given: str | None
) -> DaemonSettings:
    """``settings`` with ``[policy]`` keys given on a command line (``spec``, ``takeover``,
    ``record``; None: the config's), checked as the config's own; an error names the flag
    (``flags``: key -> the flag's name where it was typed)."""
    kinds: dict[str, type[StrEnum]] = {"takeover": TakeoverMode, "record": RecordMode}
    changes: dict[str, object] = {}
    for key, value in given.items():
        if value is None:
            continue
        kind = kinds.get(key)
        if kind is not None:
            try:
                changes[key] = kind(value)
            except ValueError:
                raise FlagError(flags[key], f"expected one of {', '.join(kind)}, got {value!r}") from None
        elif not value.strip():
            raise FlagError(flags[key], "is empty; give a LeRobot pretrained directory or module:function")
        else:
            changes[key] = value
    if not changes:
        return settings
    policy = dataclasses.replace(settings.policy, **changes)  # type: ignore[arg-type]
    try:
        policy.validate()
    except ConfigError as exc:
        raise FlagError(flags.get(exc.key, f"policy.{exc.key}"), exc.problem) from None
    return dataclasses.replace(settings, policy=policy)
