"""Two arms as the loop's one follower and one leader (LeRobot's ``bi_so_follower`` /
``bi_so_leader``): 12 joints, the left arm's six first.

The two arms of a pair are on separate serial ports, so their reads run at once: the left arm's on
a thread of its own (``hilrec-left-*``, made at the first read by the thread that reads, so it runs
at that thread's priority), the right arm's on the caller's. pyserial waits for a reply with the
GIL released, so a tick pays about one bus cycle for both arms, not two. The follower pair is read
on the loop thread and the leader pair on the loop's leader thread, so all four buses are read in
the same tick, concurrently.

Each read's start and return are taken on the monotonic clock; the skew of a tick is how far apart
the two arms' readings were taken (the midpoints of the two reads), kept beside the episode
(``tick_follower_skew_s``, ``tick_leader_skew_s``). A failed read on one arm fails the pair's read
with the same error, its message prefixed with the arm (``left follower: port ...``): the loop's
fault policy then applies to the whole take, and the fault says which arm it was.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np

from hilrec.daemon.control.sources import JointReading, WriteResult
from hilrec.daemon.errors import BusPacketError, BusTimeoutError, DeviceError
from hilrec.daemon.so101 import ARM_SIDES, NUM_JOINTS

_RETRYABLE = (BusTimeoutError, BusPacketError)


@dataclass(frozen=True, slots=True)
class _Outcome:
    reading: JointReading | None
    error: Exception | None
    began: float
    ended: float

    @property
    def middle(self) -> float:
        return (self.began + self.ended) / 2


def _run(read: Callable[[], JointReading | None]) -> _Outcome:
    began = time.monotonic()
    try:
        reading = read()
    except Exception as exc:  # noqa: BLE001 - named and raised on the caller's thread
        return _Outcome(None, exc, began, time.monotonic())
    return _Outcome(reading, None, began, time.monotonic())


def named(exc: Exception, arm: str) -> Exception:
    """``exc`` (same class, same fields) with its message prefixed by the arm it came from."""
    cls = type(exc)
    out = cls.__new__(cls)  # not copy.copy: it calls __init__, whose keywords are not in args
    out.__dict__.update(exc.__dict__)
    out.args = (f"{arm}: {exc}", *exc.args[1:])
    return out


def _worst(failed: list[tuple[str, Exception]]) -> Exception:
    """One error for the pair: a lasting failure before a retryable one, each arm named."""
    failed.sort(key=lambda item: isinstance(item[1], _RETRYABLE))
    arm, exc = failed[0]
    if len(failed) == 1:
        return named(exc, arm)
    out = named(exc, arm)
    out.args = ("; ".join(f"{a}: {e}" for a, e in failed), *exc.args[1:])
    return out


class ConcurrentPair:
    """Reads two arms at once and keeps the skew of the last read (seconds, NaN if one failed)."""

    def __init__(self, role: str) -> None:
        self.names = tuple(f"{side} {role}" for side in ARM_SIDES)
        self.thread_name = f"hilrec-left-{role}"
        self._pool: ThreadPoolExecutor | None = None
        self._skew_s = math.nan

    def take_skew(self) -> float:
        """The skew of the read since the last call (s); NaN if there was none or it failed."""
        skew, self._skew_s = self._skew_s, math.nan
        return skew

    def read(
        self, left: Callable[[], JointReading | None], right: Callable[[], JointReading | None]
    ) -> JointReading:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix=self.thread_name)
        future = self._pool.submit(_run, left)
        right_outcome = _run(right)  # on this thread, while the left arm's bus answers
        outcomes = (future.result(), right_outcome)
        self._skew_s = math.nan
        failed = [(n, o.error) for n, o in zip(self.names, outcomes, strict=True) if o.error is not None]
        if failed:
            raise _worst(failed)
        readings = [o.reading for o in outcomes]
        if readings[0] is None or readings[1] is None:  # serial arms always answer or fail
            missing = self.names[readings.index(None)]
            raise DeviceError(f"{missing} returned no reading")
        self._skew_s = abs(outcomes[0].middle - outcomes[1].middle)
        values = np.concatenate([readings[0].values, readings[1].values]).astype(np.float32)
        return JointReading(values, readings[0].retries + readings[1].retries)

    def close(self) -> None:
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True)


class FollowerPair:
    """Two followers as one: reads both buses at once, writes each its half of the goal (each
    through its own arm's clamp: ``max_relative_target`` and calibrated range)."""

    def __init__(self, left: Any, right: Any) -> None:
        self.arms = (left, right)
        self.description = f"left: {left.description}; right: {right.description}"
        self._pair = ConcurrentPair("follower")

    def take_skew(self) -> float:
        return self._pair.take_skew()

    def read(self) -> JointReading:
        return self._pair.read(self.arms[0].read, self.arms[1].read)

    def write(self, goal: np.ndarray) -> WriteResult:
        halves = (goal[:NUM_JOINTS], goal[NUM_JOINTS:])
        results: list[WriteResult] = []
        failed: list[tuple[str, Exception]] = []
        # Both arms are written even when one fails: the other keeps its new goal.
        for name, arm, half in zip(self._pair.names, self.arms, halves, strict=True):
            try:
                results.append(arm.write(half))
            except Exception as exc:  # noqa: BLE001 - raised below, named
                failed.append((name, exc))
        if failed:
            raise _worst(failed)
        sent = np.concatenate([r.sent for r in results]).astype(np.float32)
        return WriteResult(sent, clamped=any(r.clamped for r in results))

    def advance(self) -> None:
        pass  # the servos move on their own

    def close(self) -> None:
        """End the reading thread; the arms are closed by whoever opened them (the rig's stack)."""
        self._pair.close()


class LeaderPair:
    """Two leaders as one, read at once (on the loop's leader thread and one of their own)."""

    concurrent = True

    def __init__(self, left: Any, right: Any) -> None:
        self.arms = (left, right)
        self.description = f"left: {left.description}; right: {right.description}"
        self._pair = ConcurrentPair("leader")

    def take_skew(self) -> float:
        return self._pair.take_skew()

    def read(self, frame_index: int | None, observation: np.ndarray) -> JointReading | None:
        left, right = self.arms
        return self._pair.read(
            lambda: left.read(frame_index, observation[:NUM_JOINTS]),
            lambda: right.read(frame_index, observation[NUM_JOINTS:]),
        )

    def status(self) -> dict[str, Any]:
        arms = {side: arm.status() for side, arm in zip(ARM_SIDES, self.arms, strict=True)}
        return {
            "source": "serial",
            "state": "live",
            "reads": min(int(s.get("reads", 0)) for s in arms.values()),
            "arms": arms,
        }

    def close(self) -> None:
        """End the reading thread; the arms are closed by whoever opened them (the rig's stack)."""
        self._pair.close()
