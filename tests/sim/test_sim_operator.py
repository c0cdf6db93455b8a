"""The scripted operator: a deterministic leader path per seed that gets the cube into the bin."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from hilrec.daemon.errors import SimError
from hilrec.sim.episode import act_and_step, outcome_of
from hilrec.sim.operator import ScriptedOperator, shared_kinematics
from hilrec.sim.twin import Twin


def test_leader_path_is_standalone_and_deterministic() -> None:
    first = ScriptedOperator(21)
    first.reset()
    second = ScriptedOperator(21)
    second.reset()
    path = first.leader_path()
    assert path.dtype == np.float32 and path.shape[1] == 6 and len(path) > 50
    np.testing.assert_array_equal(path, second.leader_path())
    other = ScriptedOperator(22)
    other.reset()
    assert not np.array_equal(path[: len(other.leader_path())][:60], other.leader_path()[:60])
    np.testing.assert_array_equal(first.act(5, None), path[5])
    np.testing.assert_array_equal(first.act(10_000, None), path[-1])
    phases = first.phase_starts
    assert list(phases) == [
        "reach",
        "descend",
        "grasp",
        "lift",
        "carry",
        "lower",
        "release",
        "retreat",
        "home",
        "settle",
    ]
    assert all(a < b for a, b in itertools.pairwise(phases.values()))


def test_act_before_reset_is_refused() -> None:
    with pytest.raises(SimError, match="reset"):
        ScriptedOperator(0).act(0, None)


def test_gripper_opens_to_grasp_and_closes_on_the_cube() -> None:
    operator = ScriptedOperator(3)
    operator.reset()
    path, phases = operator.leader_path(), operator.phase_starts
    assert path[phases["grasp"] - 1, 5] == pytest.approx(operator.config.gripper_open, abs=1e-3)
    assert path[phases["lift"] - 1, 5] == pytest.approx(operator.config.gripper_closed, abs=1e-3)


@pytest.mark.parametrize("seed", [0, 7])
def test_operator_puts_the_cube_in_the_bin(seed: int) -> None:
    with Twin(cameras=()) as twin:
        start = twin.reset(seed)
        operator = ScriptedOperator(seed)
        operator.reset(start)
        lifted = 0.0
        for frame in range(operator.num_frames):
            act_and_step(twin, operator.act(frame, twin.observe()))
            lifted = max(lifted, twin.cube_state().position[2])
        outcome = outcome_of(twin)
    assert lifted > 0.05  # it was carried, not pushed
    assert outcome.success, outcome.check


@pytest.mark.slow  # > 5 s (make test-fast leaves it out)
def test_operator_puts_the_cube_in_the_bin_at_30_fps_in_at_least_90_percent_of_100_seeds() -> None:
    # LeRobot's default rate: the twin steps 7 x 1/210 s a frame; the plan is sampled at 30 fps.
    # About 5 s on one core (bench/bench_sim.py --fps 30 25 reports the same over any seeds).
    seeds = range(100)
    failed = []
    with Twin(fps=30, cameras=()) as twin:
        assert twin.substeps == 7
        for seed in seeds:
            start = twin.reset(seed)
            operator = ScriptedOperator(seed, fps=30, units=twin.units)
            operator.reset(start)
            for frame in range(operator.num_frames):
                act_and_step(twin, operator.act(frame, twin.observe()))
            if not outcome_of(twin).success:
                failed.append(seed)
    assert len(failed) <= 10, f"{len(failed)} of {len(seeds)} seeds failed at 30 fps: {failed}"


def test_operator_replans_when_the_cube_is_knocked_before_the_grasp() -> None:
    from hilrec.sim.episode import Push, operator_action

    with Twin(cameras=()) as twin:
        start = twin.reset(0)
        operator = ScriptedOperator(0)
        operator.reset(start)
        planned = operator.leader_path()
        knock = Push(frame=1, body="cube", force=(0.0, 1.2, 0.0))
        frame = 0
        while frame < operator.num_frames:
            action = operator_action(twin, operator, frame, twin.observe())
            act_and_step(twin, action, [knock] if frame == knock.frame else [])
            frame += 1
        outcome = outcome_of(twin)
    plan_cube = operator._require_plan().cube
    assert plan_cube is not None
    moved = np.hypot(start.cube.x - plan_cube.x, start.cube.y - plan_cube.y)
    assert len(operator.replans) == 1 and moved > 0.01
    replanned_at = operator.replans[0]
    np.testing.assert_array_equal(operator.leader_path()[:replanned_at], planned[:replanned_at])
    assert outcome.success, outcome.check


def test_operators_sharing_a_thread_plan_as_each_would_alone() -> None:
    # Operators of one thread share the IK's model copy and data; a plan must not depend on what
    # another operator (or anyone) left in that data: interleaving changes nothing, to the bit.
    import threading

    with Twin(cameras=()) as twin:
        starts = {seed: twin.reset(seed) for seed in (4, 5)}

    def knocked(seed: int) -> tuple[np.ndarray, np.ndarray, float]:
        cube = starts[seed].cube
        return cube.position + np.array([0.02, -0.015, 0.0]), cube.quaternion, 0.0

    def alone(seed: int, out: dict[int, np.ndarray]) -> None:
        operator = ScriptedOperator(seed)
        operator.reset(starts[seed])
        assert operator.watch_cube(5, *knocked(seed))
        out[seed] = operator.leader_path()

    reference: dict[int, np.ndarray] = {}
    for seed in (4, 5):  # each on a fresh thread: kinematics of its own
        worker = threading.Thread(target=alone, args=(seed, reference))
        worker.start()
        worker.join()
    first, second = ScriptedOperator(4), ScriptedOperator(5)
    first.reset(starts[4])
    shared = shared_kinematics(first.scene)  # whatever another user left in the shared data
    shared.data.qpos[:] = np.random.default_rng(0).uniform(-1, 1, shared.model.nq)
    second.reset(starts[5])
    assert second.watch_cube(5, *knocked(5))
    assert first.watch_cube(5, *knocked(4))
    np.testing.assert_array_equal(first.leader_path(), reference[4])
    np.testing.assert_array_equal(second.leader_path(), reference[5])
