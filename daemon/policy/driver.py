"""One tick of a policy: feed it, take what it answered, and say which goal is due.

:class:`PolicyDriver` is the same in the daemon's loop and in the twin's recorder; only its
runner differs (:mod:`hilrec.daemon.policy.runner`). Per tick (:meth:`PolicyDriver.step`):

1. feed the observation: every tick to a process runner (its mailbox keeps the newest), or, in
   line, only when the current chunk has no goal left (as LeRobot's action queue asks);
2. take the answers that arrived: each is checked (:func:`~hilrec.daemon.policy.chunks.refusal`);
   a refused one is counted, empties the queue (the arm holds rather than finish a plan from a
   policy that has just said something absurd) and is never sent anywhere;
3. the goal due at this tick from the newest chunk, or none (starved: the caller holds).

It records nothing itself: :class:`Step` says what the tick saw, and the caller records it
(:mod:`hilrec.daemon.policy.record`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from hilrec.daemon.errors import PolicyError
from hilrec.daemon.policy.chunks import ChunkQueue, as_chunk, refusal
from hilrec.daemon.policy.runner import InlineRunner, Runner


@dataclass(frozen=True, slots=True)
class Step:
    """What the policy offered at one tick."""

    goal: np.ndarray | None  # float32 (6,); None: nothing due, hold (starved)
    age: int  # ticks since the observation the goal came from; -1 when none
    fresh: bool  # the first tick that uses its chunk
    latency_s: float  # the inference time of the chunk in use; NaN when none
    refused: int  # answers refused at this tick

    @property
    def starved(self) -> bool:
        return self.goal is None


class PolicyDriver:
    """A runner, its chunk queue and the refusal count; see the module's text."""

    def __init__(self, runner: Runner) -> None:
        self.runner = runner
        self.name = runner.name
        self._inline = isinstance(runner, InlineRunner)
        self._queue = ChunkQueue()
        self._reset = True
        self.refused = 0
        self.last_refusal: str | None = None
        self.errors = 0

    def restart(self) -> None:
        """Forget every chunk; the next observation starts the policy afresh (its ``reset``)."""
        self._queue.clear()
        self._reset = True

    def drop(self) -> None:
        """Forget the chunks but keep the policy's own state (a human has the arm meanwhile)."""
        self._queue.clear()

    def step(self, tick: int, observation: Mapping[str, Any]) -> Step:
        dead = self.runner.dead
        if dead is not None:
            raise PolicyError(dead)
        if not self._inline or self._queue.remaining(tick) == 0:
            self.runner.submit(tick, observation, reset=self._reset)
            self._reset = False
        refused = 0
        for answer in self.runner.answers():
            why = answer.error if answer.error is not None else refusal(answer.output)
            if why is not None:
                refused += 1
                self.refused += 1
                self.errors += answer.error is not None
                self.last_refusal = f"answer to the observation of tick {answer.tick} refused: {why}"
                self._queue.clear()
                continue
            self._queue.offer(as_chunk(answer.output, tick=answer.tick, latency_s=answer.latency_s))
        due = self._queue.due(tick)
        return Step(goal=due.action, age=due.age, fresh=due.fresh, latency_s=due.latency_s, refused=refused)

    def close(self) -> None:
        self.runner.close()
