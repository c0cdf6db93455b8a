"""The two-arm twin: two packaged SO-101s attached by prefix, the handover task, its operator."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest

from hilrec.daemon.errors import ConfigError, FrameError, SimError
from hilrec.daemon.so101 import joint_names
from hilrec.sim.bimanual_operator import BimanualOperator, make_operator
from hilrec.sim.bimanual_scene import BimanualSceneConfig
from hilrec.sim.episode import operator_action, outcome_of
from hilrec.sim.operator import ScriptedOperator
from hilrec.sim.scene import SceneConfig, check_in_bin
from hilrec.sim.twin import Twin

SCENE = BimanualSceneConfig()
SUCCESS_SEEDS = range(20)


@pytest.fixture(scope="module")
def twin() -> Iterator[Twin]:
    with Twin(scene=SCENE, cameras=()) as live:
        yield live


def play(twin: Twin, seed: int) -> tuple[bool, BimanualOperator, list[np.ndarray]]:
    start = twin.reset(seed)
    operator = BimanualOperator(seed, scene=SCENE, units=twin.units)
    operator.reset(start)
    cube_path = []
    for frame in range(operator.num_frames):
        observation = twin.observe()
        twin.command(operator_action(twin, operator, frame, observation))
        twin.step_frame()
        cube_path.append(twin.cube_state().position)
    return outcome_of(twin).success, operator, cube_path


def test_joints_are_named_per_arm_left_first(twin: Twin) -> None:
    assert twin.joint_names == joint_names(2)
    assert twin.arms == 2 and twin.limits.names == joint_names(2)
    start = twin.reset(0)
    assert start.arm_units.shape == (12,) and start.arm_units.dtype == np.float32
    # Both arms start from the scene's one-arm start pose, each in its own frame.
    np.testing.assert_allclose(start.arm_units[:6], start.arm_units[6:], atol=1e-6)
    np.testing.assert_allclose(start.arm_units[:5], SCENE.arm_start[:5], atol=2.0)


def test_observations_are_copies_and_frames_are_whole_steps(twin: Twin) -> None:
    twin.reset(1)
    first = twin.observe()
    first[:] = 1e6  # scribbling on what came out cannot reach the simulator
    assert np.all(np.abs(twin.observe()) < 400)
    before = twin.time
    executed = twin.command(twin.observe())
    twin.step_frame()
    assert twin.time == pytest.approx(before + twin.substeps * twin.timestep, abs=1e-12)
    assert executed.dtype == np.float32 and executed.shape == (12,)
    with pytest.raises(FrameError, match=r"12 numbers .*left_shoulder_pan.*right_gripper"):
        twin.command(np.zeros(6, dtype=np.float32))


def test_each_arm_moves_only_its_own_joints(twin: Twin) -> None:
    def run(right_pan_offset: float) -> np.ndarray:
        twin.reset(2)
        goal = twin.observe()
        goal[6] += right_pan_offset  # right_shoulder_pan
        for _ in range(15):
            twin.command(goal)
            twin.step_frame()
        return twin.observe()

    still, turned = run(0.0), run(20.0)
    assert abs(turned[6] - still[6]) > 10.0
    # The left arm does exactly what it did without the right arm's move: nothing couples them.
    assert turned[:6].tobytes() == still[:6].tobytes()


def test_the_cube_starts_out_of_the_right_arms_reach_and_the_bin_out_of_the_left_arms() -> None:
    left, right = SCENE.arm_frames
    for seed in range(50):
        from hilrec.sim.scene import place_cube

        cube = place_cube(seed, SCENE)
        assert np.hypot(*right.to_local(cube.position)[:2]) > 0.28  # the arm reaches ~0.28 m
    assert np.hypot(*left.to_local(np.array([*SCENE.bin_center, 0]))[:2]) > 0.33


@pytest.mark.slow
def test_scripted_two_arm_operator_succeeds_on_at_least_90_percent_of_seeds(twin: Twin) -> None:
    results = {seed: play(twin, seed) for seed in SUCCESS_SEEDS}
    successes = [seed for seed, (ok, _, _) in results.items() if ok]
    assert len(successes) >= 0.9 * len(SUCCESS_SEEDS), f"succeeded on {successes}"
    # A handover, not a lucky push: every success passed the cube through the handover spot.
    for seed in successes:
        _, operator, cube_path = results[seed]
        wait = operator.phase_starts["right_reach"]
        at_handover = cube_path[wait - 1]
        assert np.hypot(*(at_handover[:2] - np.array(SCENE.handover))) < 0.02, seed
        assert not check_in_bin(at_handover, 0.0, SCENE).inside


def test_operator_plans_without_a_simulator_and_needs_a_plan() -> None:
    operator = BimanualOperator(4, scene=SCENE)
    with pytest.raises(SimError, match="reset"):
        operator.act(0)
    operator.reset()
    path = operator.leader_path()
    assert path.shape == (operator.num_frames, 12) and path.dtype == np.float32
    # The right arm holds still until the left arm is home again.
    wait = operator.phase_starts["right_reach"]
    assert np.all(path[:wait, 6:] == path[0, 6:])
    assert np.abs(np.diff(path[:wait, :6], axis=0)).max() > 0


def test_make_operator_follows_the_scene() -> None:
    assert isinstance(make_operator(0, scene=SCENE), BimanualOperator)
    assert isinstance(make_operator(0, scene=SceneConfig()), ScriptedOperator)


def test_bad_layout_is_refused_by_key() -> None:
    with pytest.raises(ConfigError, match="arm_spacing"):
        BimanualSceneConfig(arm_spacing=2.0)
