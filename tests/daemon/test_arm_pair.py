"""Two arms as one follower and one leader: both buses read at once, each arm's error named."""

from __future__ import annotations

import math
import threading

import numpy as np
import pytest

from hilrec.daemon.control.arm_pair import FollowerPair, LeaderPair, named
from hilrec.daemon.control.sources import JointReading, WriteResult
from hilrec.daemon.errors import BusTimeoutError, PortGoneError

WAIT_S = 10.0


class Arm:
    """An arm adapter whose reads meet at a barrier: they return only if both run at once."""

    def __init__(
        self, base: float, barrier: threading.Barrier | None, error: Exception | None = None
    ) -> None:
        self.description = f"arm {base}"
        self.values = np.full(6, base, np.float32)
        self.barrier = barrier
        self.error = error
        self.threads: list[str] = []
        self.written: list[np.ndarray] = []

    def _read(self) -> JointReading:
        self.threads.append(threading.current_thread().name)
        if self.barrier is not None:
            self.barrier.wait(WAIT_S)  # BrokenBarrierError if the other arm is not being read
        if self.error is not None:
            raise self.error
        return JointReading(self.values, retries=1)

    def read(self, *args: object) -> JointReading:
        return self._read()

    def write(self, goal: np.ndarray) -> WriteResult:
        if self.error is not None:
            raise self.error
        self.written.append(goal.copy())
        return WriteResult(np.asarray(goal, np.float32), clamped=bool(goal[0] > 50))

    def status(self) -> dict[str, object]:
        return {"source": "serial", "state": "live", "reads": len(self.threads)}

    def close(self) -> None:
        pass


def test_both_followers_are_read_at_once_left_first_with_their_skew() -> None:
    barrier = threading.Barrier(2)
    left, right = Arm(1.0, barrier), Arm(2.0, barrier)
    pair = FollowerPair(left, right)
    try:
        reading = pair.read()
        assert reading.values.dtype == np.float32 and reading.values.tolist() == [1.0] * 6 + [2.0] * 6
        assert reading.retries == 2
        assert left.threads[0] != right.threads[0] == threading.current_thread().name
        skew = pair.take_skew()
        assert math.isfinite(skew) and skew >= 0
        assert math.isnan(pair.take_skew())  # taken once: a tick without a read has none
    finally:
        pair.close()


def test_both_leaders_are_read_at_once_and_see_their_own_arm() -> None:
    barrier = threading.Barrier(2)
    pair = LeaderPair(Arm(3.0, barrier), Arm(4.0, barrier))
    try:
        reading = pair.read(0, np.zeros(12, np.float32))
        assert reading is not None and reading.values.tolist() == [3.0] * 6 + [4.0] * 6
        assert pair.concurrent and set(pair.status()["arms"]) == {"left", "right"}
    finally:
        pair.close()


@pytest.mark.parametrize("side", ["left", "right"])
def test_a_failed_read_on_one_arm_fails_the_pair_naming_the_arm(side: str) -> None:
    error = BusTimeoutError("no status packet", port=f"/dev/{side}", servo_id=3, register="Present_Position")
    arms = {s: Arm(1.0, None, error if s == side else None) for s in ("left", "right")}
    pair = FollowerPair(arms["left"], arms["right"])
    try:
        with pytest.raises(BusTimeoutError) as info:
            pair.read()
        assert str(info.value).startswith(f"{side} follower: port /dev/{side}, servo id 3")
        assert info.value.port == f"/dev/{side}" and info.value.servo_id == 3  # the same error, named
        assert math.isnan(pair.take_skew())
    finally:
        pair.close()


def test_a_lost_port_outranks_a_retryable_error_and_both_are_named() -> None:
    gone = PortGoneError("the port vanished", port="/dev/right")
    late = BusTimeoutError("no status packet", port="/dev/left")
    pair = FollowerPair(Arm(1.0, None, late), Arm(2.0, None, gone))
    try:
        with pytest.raises(PortGoneError) as info:
            pair.read()
        text = str(info.value)
        assert "left follower: port /dev/left" in text and "right follower: port /dev/right" in text
    finally:
        pair.close()


def test_a_goal_is_split_between_the_arms_and_a_failed_write_names_its_arm() -> None:
    left, right = Arm(0.0, None), Arm(0.0, None)
    pair = FollowerPair(left, right)
    goal = np.arange(12, dtype=np.float32) * 10
    result = pair.write(goal)
    assert left.written[0].tolist() == goal[:6].tolist() and right.written[0].tolist() == goal[6:].tolist()
    assert result.sent.tolist() == goal.tolist() and result.clamped  # the right arm's clamp
    right.error = PortGoneError("the port vanished", port="/dev/right")
    with pytest.raises(PortGoneError, match=r"^right follower: "):
        pair.write(goal)
    assert len(left.written) == 2  # the other arm still took its goal


def test_named_keeps_the_class_and_fields() -> None:
    error = named(BusTimeoutError("late", port="/dev/x", servo_id=2), "left leader")
    assert type(error) is BusTimeoutError and error.port == "/dev/x"
    assert str(error).startswith("left leader: ")
