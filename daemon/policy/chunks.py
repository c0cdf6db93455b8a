"""Action chunks indexed by tick, and the check every policy output passes before it is used.

A policy answers an observation taken at tick ``t`` with a chunk of ``k`` goals: goal ``i`` is
due at tick ``t + i``. A single goal (shape (6,), as a policy without chunking answers) is due
from tick ``t`` for :data:`SINGLE_GOAL_TICKS` ticks: an answer from another process arrives a
tick or two after its observation, and one goal has no later entries to index into.

Each tick the driver takes the goal due now from the newest chunk that has
one; when none has, nothing is due and the follower holds (the tick is *starved*). A slow
inference therefore costs the first goals of its chunk, never a late tick: the loop does not
wait for it.

A policy's output is refused whole (never clipped into range: a policy that says 1e6 is broken,
not eager) when it is not a finite float array of shape (6,) or (k, 6), or when a value lies
outside :data:`PLAUSIBLE_UNITS`; the refusal is counted and the arm holds.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from hilrec.daemon.so101 import NUM_JOINTS

# No SO-101 joint reads beyond a full turn either way in any LeRobot unit (degrees, 0..100,
# -100..100): a value past this is no goal at all. The joint range itself is the clamp's.
PLAUSIBLE_UNITS = 360.0
MAX_CHUNK = 1000
SINGLE_GOAL_TICKS = 4


@dataclass(frozen=True, slots=True)
class Chunk:
    """Goals from the observation of tick ``tick``: ``actions[i]`` is due at ``tick + i``."""

    tick: int
    actions: np.ndarray  # float32 (k, 6)
    latency_s: float  # the inference's own time, measured where it ran
    single: bool = False  # one goal (6,): due for SINGLE_GOAL_TICKS ticks

    def goal_at(self, age: int) -> np.ndarray | None:
        if age < 0:
            return None
        if age < len(self.actions):
            return self.actions[age]
        if self.single and age < SINGLE_GOAL_TICKS:
            return self.actions[0]
        return None


def refusal(output: object) -> str | None:
    """Why ``output`` is no chunk of goals, or None when it is one."""
    try:
        values = np.asarray(output, dtype=np.float64)
        given = values.shape
    except (TypeError, ValueError) as exc:
        return f"not an array of numbers ({type(output).__name__}: {exc})"
    if values.ndim == 1:
        values = values[None, :]
    if values.ndim != 2 or values.shape[1] != NUM_JOINTS or not 1 <= values.shape[0] <= MAX_CHUNK:
        wanted = f"({NUM_JOINTS},) or (k, {NUM_JOINTS}) with 1 <= k <= {MAX_CHUNK}"
        return f"shape {given}, not {wanted}"
    if not np.isfinite(values).all():
        return "non-finite values (NaN or inf)"
    worst = float(np.abs(values).max())
    if worst > PLAUSIBLE_UNITS:
        return f"a value of {worst:g}, beyond the +-{PLAUSIBLE_UNITS:g} any SO-101 joint can read"
    return None


def as_chunk(output: object, *, tick: int, latency_s: float) -> Chunk:
    """``output`` (checked by :func:`refusal` first) as a float32 chunk."""
    values = np.asarray(output, dtype=np.float64).astype(np.float32)
    return Chunk(
        tick=tick, actions=values.reshape(-1, NUM_JOINTS), latency_s=latency_s, single=values.ndim == 1
    )


@dataclass(frozen=True, slots=True)
class Due:
    """What the chunks offer at one tick."""

    action: np.ndarray | None  # float32 (6,), None: nothing due (starved)
    age: int  # ticks since the observation it came from; -1 when nothing is due
    fresh: bool  # the first tick that uses this chunk
    latency_s: float  # the inference time of the chunk in use (NaN when none)


class ChunkQueue:
    """The newest chunk, indexed by tick. A newer chunk (a later observation) replaces it."""

    def __init__(self) -> None:
        self._chunk: Chunk | None = None
        self._used = False

    def clear(self) -> None:
        self._chunk = None

    def offer(self, chunk: Chunk) -> None:
        if self._chunk is None or chunk.tick >= self._chunk.tick:
            self._chunk = chunk
            self._used = False

    def remaining(self, tick: int) -> int:
        """Goals still due at ``tick`` or later."""
        if self._chunk is None:
            return 0
        return max(0, len(self._chunk.actions) - max(0, tick - self._chunk.tick))

    def due(self, tick: int) -> Due:
        chunk = self._chunk
        if chunk is None:
            return Due(action=None, age=-1, fresh=False, latency_s=float("nan"))
        age = tick - chunk.tick
        goal = chunk.goal_at(age)
        if goal is None:
            return Due(action=None, age=-1, fresh=False, latency_s=chunk.latency_s)
        fresh = not self._used
        self._used = True
        return Due(action=goal.copy(), age=age, fresh=fresh, latency_s=chunk.latency_s)
