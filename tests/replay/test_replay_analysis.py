"""Verdicts and per-joint results of one episode, on synthetic trajectories with known faults.

The "twin" here is a first-order servo model (a few lines of numpy), so each case is exact and
fast; the same judgements on real twin replays are in test_replay_check.py.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from _results import gripper_of, lag_of, onset_of

from hilrec.daemon.replay.alignment import shift_by
from hilrec.daemon.replay.analysis import analyse
from hilrec.daemon.replay.results import (
    EXIT_CODES,
    GRIPPER,
    EpisodeResult,
    ReplayVerdict,
    Trajectories,
    to_json,
    worst,
)
from hilrec.daemon.replay.settings import ReplaySettings

FPS = 25
SETTINGS = ReplaySettings()
LIMITS = np.array([[-110.0, 110.0]] * 5 + [[0.0, 100.0]])


def commands(n: int = 300) -> np.ndarray:
    t = np.arange(n) / FPS
    cols = [
        25.0 * np.sin(2 * np.pi * f * t + p)
        for f, p in zip((0.21, 0.33, 0.27, 0.41, 0.17), (0.0, 1.1, 2.2, 3.3, 4.4), strict=True)
    ]
    cols.append(50.0 + 35.0 * np.sin(2 * np.pi * 0.3 * t))
    return np.stack(cols, axis=1)


def servo(goal: np.ndarray, *, delay: float = 0.0) -> np.ndarray:
    """Each frame the joint closes 40 % of the gap to the goal it was given a frame earlier."""
    goal = shift_by(goal, delay)
    out = np.empty_like(goal)
    out[0] = goal[0]
    for t in range(1, len(goal)):
        out[t] = out[t - 1] + 0.4 * (goal[t - 1] - out[t - 1])
    return out


def judge(
    recorded: np.ndarray, replayed: np.ndarray, action: np.ndarray, *, leader: np.ndarray | None = None
) -> EpisodeResult:
    return analyse(
        0,
        Trajectories(recorded=recorded, replayed=replayed, action=action, limits=LIMITS, leader=leader),
        fps=FPS,
        settings=SETTINGS,
    )


def test_a_recording_that_matches_the_twin_is_consistent() -> None:
    act = commands()
    rep = servo(act)
    result = judge(rep + 0.05 * np.sin(np.arange(len(act)))[:, None], rep, act)
    assert result.verdict is ReplayVerdict.CONSISTENT
    assert lag_of(result).frames == pytest.approx(0.0, abs=0.05)
    assert all(j.aligned_rms_error < 0.1 for j in result.joints)


@pytest.mark.parametrize("delay", [1.0, 2.0, 1.5, 3.4])
def test_a_late_follower_is_lagging_by_its_delay(delay: float) -> None:
    act = commands()
    result = judge(servo(act, delay=delay), servo(act), act)
    assert result.verdict is ReplayVerdict.LAGGING
    lag = lag_of(result)
    assert lag.frames == pytest.approx(delay, abs=0.1)
    assert f"{delay:.2f} frames ({delay * 1000 / FPS:.0f} ms)" in result.reason
    # The action->state cross-correlation sees the same extra delay.
    assert lag.response_recorded is not None and lag.response_replayed is not None
    extra = lag.response_recorded - lag.response_replayed
    assert extra == pytest.approx(delay, abs=0.3)


def test_a_recording_ahead_of_the_twin_is_reported_as_leading() -> None:
    act = commands()
    rep = servo(act)
    result = judge(shift_by(rep, -2.0), rep, act)
    assert result.verdict is ReplayVerdict.LAGGING
    assert lag_of(result).frames == pytest.approx(-2.0, abs=0.05)
    assert "leads" in result.reason


def test_a_frozen_servo_diverges_from_the_frame_it_froze() -> None:
    act = commands()
    rep = servo(act)
    rec = rep.copy()
    rec[150:, 1] = rec[150, 1]  # shoulder_lift reads the same from frame 150 on
    result = judge(rec, rep, act)
    assert result.verdict is ReplayVerdict.DIVERGED
    assert result.divergence_joint == "shoulder_lift"
    # Frame 150 still matches; 151 is the first off, and the one-frame timing slack may date it 152.
    assert result.divergence_onset in (151, 152)
    lift = result.joints[1]
    assert lift.stalls and lift.stalls[0].start == 150
    assert "servo stalled or not responding" in result.reason
    # The other joints still align at lag 0: one frozen servo does not drag the lag fit.
    assert lag_of(result).frames == pytest.approx(0.0, abs=0.05)
    assert "shoulder_lift" not in lag_of(result).joints_used


def test_a_short_blip_is_counted_but_not_a_divergence() -> None:
    act = commands()
    rep = servo(act)
    rec = rep.copy()
    rec[100:102, 0] += 30.0  # two frames of garbage (a corrupt reply), 80 ms < 0.2 s
    result = judge(rec, rep, act)
    assert result.joints[0].blips == 1
    assert result.joints[0].divergence is None
    # ...but 30 deg for two frames of 300 is an RMS of 2.4 deg: over the RMS limit.
    assert result.verdict is ReplayVerdict.DIVERGED and "RMS error" in result.reason


def test_a_grasp_is_gripper_behaviour_not_divergence() -> None:
    act = commands()
    rep = servo(act)
    rec = rep.copy()
    # The real jaw closes on an object and stops at 30 while the command goes lower.
    held = act[:, GRIPPER] < 30.0
    rec[:, GRIPPER] = np.maximum(rep[:, GRIPPER], 30.0)
    result = judge(rec, rep, act)
    g = gripper_of(result)
    assert g.grasp_frames > 0 and g.held_opening == pytest.approx(30.0, abs=0.5)
    assert g.grasp_frames <= int(held.sum())
    assert result.joints[GRIPPER].divergence is None
    assert result.verdict is ReplayVerdict.CONSISTENT


def test_commands_at_and_beyond_the_range_and_leader_mismatch_are_counted() -> None:
    act = commands()
    act[10:20, 0] = 120.0  # beyond shoulder_pan's 110
    act[30:35, GRIPPER] = 100.0  # fully open: at the end of the range
    rep = servo(act)
    leader = act.copy()
    leader[40:44, 2] += 3.0  # a max_relative_target clamp: sent != leader
    result = judge(rep, rep, act, leader=leader)
    pan, grip, elbow = result.joints[0], result.joints[GRIPPER], result.joints[2]
    assert pan.beyond_range_frames == 10 and pan.at_limit_frames >= 10
    assert grip.at_limit_frames >= 5 and grip.beyond_range_frames == 0
    assert elbow.leader_mismatch_frames == 4
    assert any("beyond the joint range" in note for note in result.notes)
    assert any("differs from the leader" in note for note in result.notes)


def test_too_short_or_still_episodes() -> None:
    act = commands(12)
    short = judge(act, act, act)
    assert short.verdict is ReplayVerdict.NOT_REPLAYABLE and "frames" in short.reason
    still = np.tile(commands()[:1], (100, 1))
    result = judge(still, still, still)
    assert result.verdict is ReplayVerdict.CONSISTENT
    assert lag_of(result).frames is None and "lag not estimable" in result.reason


def test_json_is_plain_and_complete() -> None:
    act = commands()
    result = judge(servo(act, delay=1.0), servo(act), act)
    doc = json.loads(json.dumps(to_json(result)))
    assert doc["verdict"] == "lagging"
    assert doc["lag"]["frames"] == pytest.approx(1.0, abs=0.1)
    assert doc["lag"]["ms"] == pytest.approx(40.0, abs=4.0)
    assert set(doc["joints"]) == {
        "shoulder_pan",
        "shoulder_lift",
        "elbow_flex",
        "wrist_flex",
        "wrist_roll",
        "gripper",
    }
    assert len(doc["lag"]["curve"]["shifts"]) == 16


def test_exit_codes_follow_the_worst_verdict() -> None:
    assert set(EXIT_CODES) == set(ReplayVerdict)
    assert EXIT_CODES[ReplayVerdict.CONSISTENT] == 0
    assert len(set(EXIT_CODES.values())) == len(ReplayVerdict)
    assert worst([ReplayVerdict.CONSISTENT, ReplayVerdict.LAGGING]) is ReplayVerdict.LAGGING
    assert worst([ReplayVerdict.DIVERGED, ReplayVerdict.LAGGING]) is ReplayVerdict.DIVERGED
    assert worst([ReplayVerdict.DIVERGED, ReplayVerdict.NOT_REPLAYABLE]) is ReplayVerdict.NOT_REPLAYABLE
    assert worst([]) is ReplayVerdict.CONSISTENT


def test_a_whole_observation_frozen_half_way_does_not_choose_the_lag() -> None:
    # A late follower (2 frames) whose every reading repeats from frame 150 on (the bus failed and
    # the recorder kept the last good row): the frozen half would pull a whole-episode fit.
    act = commands()
    rep = servo(act)
    rec = servo(act, delay=2.0)
    rec[150:] = rec[149]
    result = judge(rec, rep, act)
    assert result.verdict is ReplayVerdict.DIVERGED
    assert lag_of(result).frames == pytest.approx(2.0, abs=0.1)
    assert lag_of(result).fitted_frames <= 151
    assert 148 <= onset_of(result) <= 152
