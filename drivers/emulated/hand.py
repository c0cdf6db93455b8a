"""The scripted person's hand on an emulated leader, and who wins when it and the torque disagree.

A leader a policy rollout keeps under torque (its servos following the follower, with a low
Torque_Limit) has a person's hand on it as well. The hand has a path (where it would move the
arm: the scripted operator's, a wave...) and a script saying when it takes hold:

- ``grip`` (the default, and what every emulated leader did before): it always holds the arm
  and moves it along its path;
- ``rest``: it rests on the arm while any servo is under torque, applying no force (the arm goes
  where its servos take it, the hand with it), and moves it along its path whenever the torque
  is off: the person of ``takeover = "key"``, who lets the leader follow and takes hold when the
  torque lets go;
- ``push:after_s=S``: rests like ``rest``, then, ``S`` seconds after the torque came on, takes
  hold and pushes along its path against the torque: the person of ``takeover = "leader"``.

A hand that takes hold continues from where the arm is: its target is its path plus the gap
from the arm to the path at that instant, a gap that fades with time constant ``blend_s`` (a
person who takes the arm where it is and goes back to what they meant to do), so taking hold
never makes the arm jump.

Force against torque, per joint: the hand pushes with ``force`` (in Torque_Limit units, 0.1 %
of the servo's stall torque: a person's light grip on a leader, about 35 %). When the hand holds
a joint whose servo is under torque, the hand wins if the servo's Torque_Limit is below its
force (the servo yields, the joint goes where the hand takes it); otherwise the servo wins and
drives to its goal with the difference. A servo with no hand on it drives with its whole limit;
it goes slower when it has little torque to spare (:class:`~hilrec.drivers.emulated.motion.ServoMotion`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum

import numpy as np

from hilrec.daemon.errors import ConfigError

Path = Callable[[float], np.ndarray]  # seconds since start -> actual ticks (6,)
# A person's light grip, in Torque_Limit units (0.1 % of the stall torque).
HAND_FORCE = 350.0
FULL_TORQUE = 1000.0


class HandMode(StrEnum):
    GRIP = "grip"
    REST = "rest"
    PUSH = "push"


@dataclass(frozen=True, kw_only=True)
class HandScript:
    """When the hand takes hold (see the module's text); ``parse`` reads ``--hand``'s syntax."""

    mode: HandMode = HandMode.GRIP
    after_s: float = 3.0  # push: seconds under torque before the hand pushes
    force: float = HAND_FORCE
    blend_s: float = 1.0

    @classmethod
    def parse(cls, text: str) -> HandScript:
        """``grip``, ``rest`` or ``push[:after_s=S][,force=F]``; a bad one names the problem."""
        name, _, rest = text.strip().partition(":")
        try:
            mode = HandMode(name)
        except ValueError:
            known = ", ".join(m.value for m in HandMode)
            raise ConfigError("hand", f"unknown hand {name!r} (known: {known})") from None
        values: dict[str, float] = {}
        for item in filter(None, (part.strip() for part in rest.split(","))):
            key, sep, value = item.partition("=")
            if not sep or key not in ("after_s", "force", "blend_s"):
                raise ConfigError("hand", f"{text!r}: expected after_s=, force= or blend_s=, got {item!r}")
            try:
                values[key] = float(value)
            except ValueError:
                raise ConfigError("hand", f"{text!r}: {key} must be a number, got {value!r}") from None
        script = cls(mode=mode, **values)
        if not (script.after_s >= 0 and 0 <= script.force <= FULL_TORQUE and script.blend_s > 0):
            raise ConfigError(
                "hand", f"{text!r}: after_s >= 0, force in 0..{FULL_TORQUE:g}, blend_s > 0 are required"
            )
        return script


class Hand:
    """A hand moving along ``path`` by ``script``; :meth:`target` is asked once per motion step."""

    def __init__(self, path: Path, script: HandScript | None = None) -> None:
        self.path = path
        self.script = script or HandScript()
        self.force = self.script.force
        self._torque_since: float | None = None
        self._held_since: float | None = None
        self._gap: np.ndarray | None = None

    def holds(self, t: float, under_torque: bool) -> bool:
        """Whether the hand holds the arm at ``t`` (seconds since start)."""
        if under_torque and self._torque_since is None:
            self._torque_since = t
        elif not under_torque:
            self._torque_since = None
        mode = self.script.mode
        if mode == HandMode.GRIP or not under_torque:
            return True
        return (
            mode == HandMode.PUSH
            and self._torque_since is not None
            and (t - self._torque_since >= self.script.after_s)
        )

    def target(self, t: float, arm: np.ndarray, under_torque: bool) -> np.ndarray | None:
        """Where the hand takes the arm at ``t``, None while it rests (no force on the arm)."""
        if not self.holds(t, under_torque):
            self._held_since = self._gap = None
            return None
        along = np.asarray(self.path(t), dtype=np.float64)
        if self._held_since is None:
            self._held_since = t
            # The path picks up the arm where it is: a grip from the first instant has no gap.
            self._gap = None if self.script.mode == HandMode.GRIP else arm - along
        if self._gap is None:
            return along
        return along + self._gap * math.exp(-(t - self._held_since) / self.script.blend_s)
