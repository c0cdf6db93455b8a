"""The one clamp every goal passes before it reaches an actuator, whatever sent it.

A goal comes from a person's leader arm, a remote peer, a replay or a policy; each can be wrong
(a mis-calibrated leader, 720 degrees in a message, a policy's wild output). The follower's
``write`` puts every goal through :meth:`GoalLimits.clamp`:

1. cast to float32 first: the number recorded is then exactly the number executed;
2. refuse a wrong shape or a non-finite value (``ActionError``: the loop holds and marks the frame);
3. limit each joint's step from the present position to ``max_step`` (LeRobot's
   ``max_relative_target``), when configured;
4. clip to the joint range ``[low, high]``, last, so nothing can move a joint out of it.

The recorded action is the returned goal, and ``clamped`` says whether steps 3-4 changed it.
The hardware follower's range is the calibrated one, the twin's the actuators' ``ctrlrange``:
each gives float32 bounds in dataset units, chosen so that the bound itself converts to a value
inside the range (see :func:`inner_bounds`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from hilrec.daemon.errors import ActionError
from hilrec.daemon.so101 import JOINT_NAMES


class GoalLimits:
    """``low``/``high``: float32 (6,) in dataset units; ``max_step``: units per command from the
    present position (float64 (6,)), or None for no step limit. ``names``: the joints, in
    column order (two arms: ``so101.joint_names(2)``, twelve of each)."""

    def __init__(
        self,
        low: np.ndarray,
        high: np.ndarray,
        max_step: np.ndarray | None = None,
        *,
        names: Sequence[str] = JOINT_NAMES,
    ) -> None:
        self.names = tuple(names)
        count = len(self.names)
        self.low = np.asarray(low, dtype=np.float32)
        self.high = np.asarray(high, dtype=np.float32)
        if self.low.shape != (count,) or self.high.shape != (count,) or not np.all(self.low <= self.high):
            raise ActionError(f"joint limits must be {count} ordered pairs, got {self.low} .. {self.high}")
        self.max_step = None if max_step is None else np.asarray(max_step, dtype=np.float64)
        # Plain floats for the usual in-range test: six comparisons, no numpy call.
        self._bounds = list(zip(self.low.tolist(), self.high.tolist(), strict=True))

    def clamp(
        self, goal: Sequence[float] | np.ndarray, present: np.ndarray | None = None
    ) -> tuple[np.ndarray, bool]:
        """The float32 goal to execute and record, and whether it had to be changed."""
        values = np.asarray(goal)
        if values.shape != self.low.shape:
            raise ActionError(
                f"a goal is {len(self.names)} numbers ({', '.join(self.names)}), got shape {values.shape}"
            )
        if values.dtype == np.float32:
            asked = values.astype(np.float32)  # a copy; no cast can overflow
        else:
            with np.errstate(over="ignore", invalid="ignore"):  # 1e39 becomes inf, refused below
                asked = values.astype(np.float32)
        if self.max_step is None:
            # The usual case, six comparisons on Python floats: NaN and inf fail them too.
            listed = asked.tolist()
            if all(lo <= v <= hi for v, (lo, hi) in zip(listed, self._bounds, strict=True)):
                return asked, False
        if not np.isfinite(asked).all():
            bad = [name for name, ok in zip(self.names, np.isfinite(asked), strict=True) if not ok]
            raise ActionError(f"non-finite goal for {', '.join(bad)}: {values.tolist()}")
        sent = asked
        if self.max_step is not None:
            if present is None:
                raise ActionError("a step limit needs the present position")
            now = np.asarray(present, dtype=np.float64)
            step = np.clip(asked.astype(np.float64) - now, -self.max_step, self.max_step)
            sent = (now + step).astype(np.float32)
        if not all(lo <= v <= hi for v, (lo, hi) in zip(sent.tolist(), self._bounds, strict=True)):
            sent = np.clip(sent, self.low, self.high)
        if sent is asked:
            return asked, False
        return sent, bool(np.any(sent != asked))


def inner_bounds(
    low: np.ndarray, high: np.ndarray, inside: Callable[[int, float], bool]
) -> tuple[np.ndarray, np.ndarray]:
    """float32 ``low``/``high`` moved inwards, one float32 step at a time, until ``inside(joint,
    bound)`` holds for both: a bound computed in float64 and rounded to float32 may convert to a
    servo tick or an actuator value just outside the range it came from."""
    low32 = np.asarray(low, dtype=np.float64).astype(np.float32)
    high32 = np.asarray(high, dtype=np.float64).astype(np.float32)
    for i in range(len(low32)):
        while not inside(i, float(low32[i])) and low32[i] < high32[i]:
            low32[i] = np.nextafter(low32[i], np.float32(np.inf))
        while not inside(i, float(high32[i])) and high32[i] > low32[i]:
            high32[i] = np.nextafter(high32[i], np.float32(-np.inf))
    return low32, high32
