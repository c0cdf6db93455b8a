"""LeRobot 0.4.4's own ``lerobot-teleoperate --robot.type=bi_so_follower
--teleop.type=bi_so_leader`` against four standalone ``hilrec emulate`` arms (issue 21): it runs
to the end, and each follower goes where *its* leader is, the left where the left leader stands
and the right where the right one does (the two leaders are put in different poses, so arms
crossed over, or one arm left behind, fail).

The harness is tests/drivers/_teleoperate.py. A run lost only to LeRobot's client missing a
status packet on a loaded machine (a timing outcome: bench/bench_lerobot_clients.py counts
those) is run again from new poses; any other failure fails at once."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from _teleoperate import (
    BODY,
    POSES,
    RUN_TIMEOUT_S,
    TELEOP_TIME_S,
    emulated_pairs,
    missed_a_reply,
    settled,
    teleoperate_pair,
)

# (left, right) leader poses for each attempt: always two different poses, and each side's differs
# from its pose of the attempt before. Three attempts were too few at three pytest workers on two
# cores: all three lost a reply there (a torque write failing six tries, servos missing from the
# connect ping), so a test of following failed on timing, which the benchmark reports as a rate.
ATTEMPTS = [(POSES[i % len(POSES)], POSES[(i + 1) % len(POSES)]) for i in range(8)]


@pytest.mark.slow
@pytest.mark.timeout(len(ATTEMPTS) * (RUN_TIMEOUT_S + 60))
def test_lerobot_bimanual_teleoperate_drives_each_follower_where_its_leader_is(tmp_path: Path) -> None:
    lost: list[str] = []
    with emulated_pairs(tmp_path / "calibration") as (followers, leaders):
        calibrations = tmp_path / "calibration"
        assert sorted(p.name for p in calibrations.iterdir()) == [
            "emulated_follower_left.json",
            "emulated_follower_right.json",
            "emulated_leader_left.json",
            "emulated_leader_right.json",
        ]
        for number, poses in enumerate(ATTEMPTS, 1):
            targets = []
            for leader, follower, pose in zip(leaders, followers, poses, strict=True):
                leader.place(pose)
                targets.append(leader.read())
                assert np.abs(follower.read() - targets[-1])[BODY].max() > 10.0, (follower.role, pose)
            assert np.abs(targets[0] - targets[1])[BODY].max() > 10.0  # the sides are told apart
            done = teleoperate_pair(followers, leaders)
            output = done.stdout + done.stderr
            if done.returncode != 0 and missed_a_reply(output):
                lost.append(f"run {number}: {output[-600:]}")  # timing: the benchmark's to count
                continue
            assert done.returncode == 0, f"run {number}: exit {done.returncode}\n{output[-4000:]}"
            assert output.count("Teleop loop time") >= TELEOP_TIME_S * 10, f"run {number}: too few loops"
            for follower, target in zip(followers, targets, strict=True):
                goal = follower.read("Goal_Position")
                assert np.abs(goal - target).max() < 1.0, (number, follower.role, goal, target)
                present = settled(follower, target)
                assert np.abs(present - target)[BODY].max() < 3.0, (number, follower.role, present, target)
            return
    pytest.fail("every run missed a status packet:\n" + "\n".join(lost))
