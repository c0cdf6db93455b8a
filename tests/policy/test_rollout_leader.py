"""The daemon's rollout leader, tick by tick on its own (no daemon): who drives, the switch's
catch-up within the per-tick clamp, the leader takeover threshold, starved and refused ticks."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from hilrec.daemon.control.rollout import RolloutLeader
from hilrec.daemon.control.sources import JointReading
from hilrec.daemon.dataset import FrameFlag
from hilrec.daemon.errors import BusTimeoutError
from hilrec.daemon.policy.driver import PolicyDriver
from hilrec.daemon.policy.load import load_policy
from hilrec.daemon.policy.record import ControlSource
from hilrec.daemon.policy.runner import InlineRunner
from hilrec.daemon.wire.policy_settings import PolicySettings

POLICIES = Path(__file__).with_name("_policies.py")
HOME = np.zeros(6, dtype=np.float32)
WAIT_S = 30.0


class HandAt:
    """A leader arm a person holds still at ``where`` (the loop's Leader protocol)."""

    description = "a hand"

    def __init__(self, where: np.ndarray) -> None:
        self.where = np.asarray(where, dtype=np.float32)

    def read(self, frame_index: int | None, observation: np.ndarray) -> JointReading | None:
        return JointReading(self.where.copy())

    def status(self) -> dict[str, Any]:
        return {"source": "test", "state": "live"}

    def close(self) -> None:
        pass


def leader(policy: str, hand: np.ndarray, **settings: Any) -> RolloutLeader:
    driver = PolicyDriver(InlineRunner(load_policy(f"{POLICIES}:{policy}")))
    rollout = RolloutLeader(HandAt(hand), driver, PolicySettings(spec=policy, **settings))
    rollout.begin_episode()
    return rollout


def intervened(reading: JointReading | None) -> bool:
    assert reading is not None and reading.features is not None
    return bool(reading.features["intervention"][0])


def tick(rollout: RolloutLeader, frame: int, observation: np.ndarray) -> JointReading:
    reading = rollout.read(frame, observation)
    assert reading is not None
    rollout.note_sent(reading.values)  # a follower that executes exactly what it is sent
    return reading


def test_a_takeover_catches_up_with_the_hand_within_the_clamp() -> None:
    hand = np.array([40.0, -30.0, 0.0, 0.0, 0.0, 50.0], dtype=np.float32)
    rollout = leader("hold_still", hand, max_relative_target=5.0)
    sent = [tick(rollout, k, HOME).values for k in range(3)]
    rollout.request(ControlSource.HUMAN)
    readings = [tick(rollout, k, sent[-1]) for k in range(3, 20)]
    sent += [r.values for r in readings]
    steps = np.abs(np.diff(np.stack(sent).astype(np.float64), axis=0)).max(axis=1)
    assert steps.max() <= 5.0 + 1e-5
    np.testing.assert_array_equal(sent[-1], hand)  # caught up, then the hand's goal itself
    assert [intervened(r) for r in readings] == [True] * len(readings)
    fields, arrays = rollout.record(20)
    assert fields["rollout"]["takeovers"] == 1
    assert fields["rollout"]["switches"][0] == {"frame": 3, "to": "human", "goal_step": 5.0, "max_step": 5.0}
    assert arrays["control_source"].tolist() == [0] * 3 + [1] * 17


def test_a_takeover_on_a_held_tick_is_recorded_on_that_frame() -> None:
    """The switch's frame in the sidecar is the first row the intervention column marks, also
    when the loop held that tick (its follower write did not happen, so nothing was sent): seen
    on a loaded machine as switches [50, 100] against the column's [49, 100]."""
    rollout = leader("hold_still", HOME + 1, max_relative_target=5.0)
    for k in range(3):
        tick(rollout, k, HOME)
    rollout.request(ControlSource.HUMAN)
    held = rollout.read(3, HOME)  # the takeover's tick; the loop holds it and sends nothing
    column = [False] * 3 + [intervened(held)]
    column += [intervened(tick(rollout, k, HOME)) for k in range(4, 8)]
    fields, arrays = rollout.record(8)
    assert column == [False] * 3 + [True] * 5
    assert [s["frame"] for s in fields["rollout"]["switches"]] == [column.index(True)]
    assert arrays["control_source"].tolist() == [int(c) for c in column]


class FlakyHand(HandAt):
    """A hand whose leader bus times out on the frames in ``fails`` (a loaded machine)."""

    def __init__(self, where: np.ndarray, fails: set[int]) -> None:
        super().__init__(where)
        self.fails = fails

    def read(self, frame_index: int | None, observation: np.ndarray) -> JointReading | None:
        if frame_index in self.fails:
            raise BusTimeoutError(f"no answer on frame {frame_index}", port="leader")
        return super().read(frame_index, observation)


def test_a_handback_on_a_failed_leader_read_is_recorded_on_that_frame() -> None:
    """The loop records a frame whose leader read raised with the hand ``frame_features`` names;
    the sidecar's switch is on that frame too. Seen on a loaded machine: handback [50, 103]
    against the column's [50, 99], the leader's reads of frames 99 to 102 having timed out."""
    hand = FlakyHand(HOME + 1, fails={4, 5})
    driver = PolicyDriver(InlineRunner(load_policy(f"{POLICIES}:hold_still")))
    rollout = RolloutLeader(hand, driver, PolicySettings(spec="hold_still", max_relative_target=5.0))
    rollout.begin_episode()
    rollout.request(ControlSource.HUMAN)
    column = [intervened(tick(rollout, k, HOME)) for k in range(4)]
    rollout.request(ControlSource.POLICY)
    for k in (4, 5):
        with pytest.raises(BusTimeoutError):
            rollout.read(k, HOME)  # the handback is applied before the hand's read fails
        rollout.note_sent(HOME)  # the loop holds the arm
        column.append(bool(rollout.frame_features(k)["intervention"][0]))
    column += [intervened(tick(rollout, k, HOME)) for k in range(6, 8)]
    fields, arrays = rollout.record(8)
    assert column == [True] * 4 + [False] * 4
    switches = [(s["frame"], s["to"]) for s in fields["rollout"]["switches"]]
    assert switches == [(4, "policy")]
    assert arrays["control_source"].tolist() == [int(c) for c in column]


def test_the_leader_moved_away_takes_over_in_leader_mode() -> None:
    near = leader("hold_still", HOME + 1, takeover="leader", leader_threshold=10.0)
    assert not intervened(tick(near, 0, HOME))
    far = leader("hold_still", HOME + 20, takeover="leader", leader_threshold=10.0)
    assert intervened(far.read(0, HOME))


def test_refused_answers_hold_and_are_flagged() -> None:
    rollout = leader("huge", HOME)
    start = HOME + 3
    first = tick(rollout, 0, start)
    assert first.flags & FrameFlag.STARVED and first.flags & FrameFlag.POLICY_REFUSED
    np.testing.assert_array_equal(first.values, start)  # held where the arm is
    second = tick(rollout, 1, start + 1)
    np.testing.assert_array_equal(second.values, start)  # held at the goal sent last
    assert rollout.status()["refused_answers"] == 2


class SlowRelease:
    """A following leader whose release is slow (a loaded bus): it blocks until ``go`` is set."""

    def __init__(self) -> None:
        self.engaged = True
        self.releasing = threading.Event()
        self.go = threading.Event()

    def update(self, follow: bool, observation: np.ndarray, leader: JointReading | None) -> None:
        if not follow and self.engaged:
            self.releasing.set()
            assert self.go.wait(WAIT_S)
            self.engaged = False

    def status(self) -> dict[str, Any]:
        return {"engaged": self.engaged}

    def close(self) -> None:
        pass


def test_a_status_during_a_takeover_is_of_one_tick_edge() -> None:
    """Seen: a status read between the switch to the human and the leader's release said the
    human had the arm while the leader was still under torque."""
    rollout = leader("hold_still", HOME + 20, takeover="leader", leader_threshold=10.0)
    follow = SlowRelease()
    rollout.follow = follow  # type: ignore[assignment]
    rollout._leader_arrived = True  # the following leader has been at the arm once
    ticking = threading.Thread(target=tick, args=(rollout, 0, HOME))
    ticking.start()
    assert follow.releasing.wait(WAIT_S)
    seen: list[dict[str, Any]] = []
    asking = threading.Thread(target=lambda: seen.append(rollout.status()))
    asking.start()
    asking.join(0.5)  # a status that does not wait for the tick is back by now
    follow.go.set()
    ticking.join(WAIT_S)
    asking.join(WAIT_S)
    assert not ticking.is_alive() and not asking.is_alive()
    status = seen[0]
    assert (status["control"], status["leader_follow"]["engaged"]) in {("policy", True), ("human", False)}
