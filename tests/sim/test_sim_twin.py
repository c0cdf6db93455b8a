"""The twin's contract: whole substeps, float32-first commands, copies out, exact state restore."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from hilrec.daemon.errors import FeatureSpecError, FrameError, FrameRateError, SimError
from hilrec.daemon.so101 import so101_features
from hilrec.sim.features import check_measurable, sim_features
from hilrec.sim.scene import SceneConfig, place_cube
from hilrec.sim.twin import Twin, substeps_for, timestep_for, valid_frame_rates


@pytest.fixture(scope="module")
def twin() -> Iterator[Twin]:
    with Twin(fps=25, cameras=()) as t:
        yield t


def test_a_frame_is_a_whole_number_of_steps() -> None:
    assert substeps_for(25, 0.005) == 8
    assert substeps_for(50, 0.005) == 4
    assert 25 in valid_frame_rates(0.005) and 30 not in valid_frame_rates(0.005)


def test_frame_rate_that_is_not_whole_substeps_of_a_given_timestep_is_refused_with_nearby_rates() -> None:
    with pytest.raises(FrameRateError) as caught:
        Twin(fps=30, cameras=(), scene=SceneConfig(timestep=0.005))
    message = str(caught.value)
    assert "fps 30" in message and "valid rates near it: 10, 20, 25, 40" in message
    assert "timestep 0.005 s was given" in message
    with pytest.raises(FrameRateError, match="valid rates near it"):
        timestep_for(30, 0.004)  # 8.33 steps
    with pytest.raises(FrameRateError):
        substeps_for(0, 0.005)
    with pytest.raises(FrameRateError, match="positive integer"):
        timestep_for(0)


def test_the_timestep_is_chosen_for_the_frame_rate_when_none_is_given() -> None:
    # 5 ms wherever it divides the frame: 25 fps stays exactly as it was.
    for fps in (1, 5, 10, 20, 25, 40, 50, 100, 200):
        assert timestep_for(fps) == 0.005
    assert timestep_for(30) == 1 / 210 and substeps_for(30, timestep_for(30)) == 7
    for fps in range(1, 241):
        step = timestep_for(fps)
        substeps = substeps_for(fps, step)
        # Whole steps, none above 5 ms, and the largest such: one step fewer would exceed 5 ms.
        assert step <= 0.005 and substeps * fps * step == pytest.approx(1.0, abs=1e-12)
        assert substeps == 1 or 1 / (fps * (substeps - 1)) > 0.005
        assert fps in valid_frame_rates(step)
    assert timestep_for(30, 0.002 / 1.2) == 0.002 / 1.2  # a given step that divides is kept
    with Twin(fps=30, cameras=()) as twin:
        assert twin.timestep == 1 / 210 and twin.substeps == 7
        assert twin.scene.timestep == twin.timestep  # the scene as run carries its step
        assert twin.physics_info()["timestep"] == 1 / 210 and twin.physics_info()["substeps"] == 7
        twin.reset(0)
        for _ in range(3):
            twin.step_frame()
        assert twin.time == pytest.approx(3 / 30, abs=1e-12)
    with Twin(fps=25, cameras=()) as twin:
        assert (twin.timestep, twin.substeps) == (0.005, 8)


def test_step_frame_advances_exactly_one_frame(twin: Twin) -> None:
    twin.reset(1)
    assert twin.time == 0.0
    for frame in range(1, 4):
        twin.step_frame()
        assert twin.time == pytest.approx(frame * twin.substeps * twin.timestep, abs=1e-12)
    assert twin.frame_index == 3


def test_command_casts_to_float32_before_converting(twin: Twin) -> None:
    twin.reset(2)
    action = np.array([10.000000001, -30.0, 20.0, 60.0, 5.0, 40.0], dtype=np.float64)
    executed = twin.command(action)
    assert executed.dtype == np.float32
    np.testing.assert_array_equal(executed, action.astype(np.float32))
    expected = executed.astype(np.float64) / twin.units.scale + twin.units.offset
    np.testing.assert_array_equal(twin.actuator_targets(), expected)
    # values that differ below float32 resolution drive the twin identically
    twin.command(action + 1e-9)
    np.testing.assert_array_equal(twin.actuator_targets(), expected)


def test_command_clips_to_limits_and_reports_what_was_executed(twin: Twin) -> None:
    twin.reset(2)
    executed = twin.command(np.array([500.0, 0, 0, 0, 0, -20.0]))
    _, high = twin.units.units_limits()
    assert executed[0] <= high[0] and executed[5] >= 0.0
    assert twin.clipped_commands == 1
    ctrl = twin.actuator_targets()
    assert ctrl[0] <= twin.units.joint_ranges[0][1] + 1e-5


def test_bad_commands_are_refused_by_name(twin: Twin) -> None:
    with pytest.raises(FrameError, match="wrist_flex"):
        twin.command([0, 0, 0, float("nan"), 0, 0])
    with pytest.raises(FrameError, match="shape"):
        twin.command([0, 0, 0])


def test_observe_reads_state_and_returns_copies(twin: Twin) -> None:
    start = twin.reset(3)
    observed = twin.observe()
    assert observed.dtype == np.float32 and observed.shape == (6,)
    np.testing.assert_array_equal(observed, start.arm_units)
    observed[:] = 999
    assert not np.array_equal(twin.observe(), observed)
    state = twin.get_state()
    state[:] = 0
    assert np.any(twin.get_state() != 0)
    cube = twin.cube_state()
    cube.position[:] = 5
    assert twin.cube_state().position[2] < 1


def test_state_restore_replays_bit_for_bit(twin: Twin) -> None:
    start = twin.reset(4)
    rng = np.random.default_rng(0)
    actions = (start.arm_units + rng.normal(0, 8, size=(40, 6))).astype(np.float32)

    def play() -> np.ndarray:
        rows = []
        for action in actions:
            rows.append(twin.observe())
            twin.command(action)
            twin.step_frame()
        return np.array(rows)

    first = play()
    end_state = twin.get_state()
    twin.set_state(start.state)
    second = play()
    np.testing.assert_array_equal(first, second)
    np.testing.assert_array_equal(end_state, twin.get_state())


def test_reset_places_the_cube_from_the_seed(twin: Twin) -> None:
    a = twin.reset(11)
    b = twin.reset(11)
    np.testing.assert_array_equal(a.state, b.state)
    assert a.cube == place_cube(11, twin.scene)
    c = twin.reset(12)
    assert (c.cube.x, c.cube.y) != (a.cube.x, a.cube.y)
    position = twin.cube_state().position
    assert position[:2] == pytest.approx([c.cube.x, c.cube.y], abs=2e-3)


def test_bad_states_are_refused(twin: Twin) -> None:
    with pytest.raises(SimError, match="values"):
        twin.set_state(np.zeros(3))
    state = twin.reset(5).state.copy()
    state[2] = np.inf
    with pytest.raises(SimError, match="non-finite"):
        twin.set_state(state)


def test_diverging_simulation_raises(twin: Twin) -> None:
    state = twin.reset(5).state.copy()
    nq = 6 + 7  # six arm joints and the cube's free joint
    state[1 + nq] = 1e12  # mjSTATE_INTEGRATION starts time, qpos, qvel: the first joint's qvel
    twin.set_state(state)
    with pytest.raises(SimError, match="MuJoCo warning"):
        twin.step_frame()


def test_push_targets_known_bodies_only(twin: Twin) -> None:
    twin.reset(6)
    with pytest.raises(SimError, match="pushable"):
        twin.push("table", (1, 0, 0))
    before = twin.cube_state().position
    twin.push("cube", (3.0, 0, 0))
    twin.step_frame()
    assert twin.cube_state().position[0] > before[0] + 1e-3


def test_scene_config_is_validated() -> None:
    from hilrec.daemon.errors import ConfigError

    with pytest.raises(ConfigError, match="timestep"):
        SceneConfig(timestep=0.5)


def test_only_measurable_features_are_accepted() -> None:
    features = sim_features({"front": (48, 64)})
    check_measurable(features)
    unmeasurable: list[tuple[str, dict[str, Any]]] = [
        ("observation.cube_pose", {"dtype": "float32", "shape": [7], "names": None}),
        ("observation.environment_state", {"dtype": "float32", "shape": [3]}),
        ("observation.velocity", {"dtype": "float32", "shape": [6]}),
    ]
    for key, spec in unmeasurable:
        with pytest.raises(FeatureSpecError, match="not measurable on a real SO-101"):
            check_measurable({**features, key: spec})
    bad_state = dict(so101_features())
    bad_state["observation.state"] = {"dtype": "float32", "shape": [9], "names": None}
    with pytest.raises(FeatureSpecError, match=re.escape("observation.state")):
        check_measurable(bad_state)


def test_render_any_scene_camera_as_a_fresh_uint8_image() -> None:
    with Twin(fps=25, cameras=("front",), image_size=(48, 64)) as twin:
        twin.reset(0)
        front = twin.render("front")
        assert front.dtype == np.uint8 and front.shape == (48, 64, 3)
        assert front.std() > 5  # not a blank frame
        wrist = twin.render("wrist", (24, 32))
        assert wrist.shape == (24, 32, 3)
        front[:] = 0
        assert twin.render("front").any()
        with pytest.raises(SimError, match="no camera 'top'"):
            twin.render("top")
    with pytest.raises(SimError, match="no camera"):
        Twin(cameras=("ceiling",), image_size=(48, 64))


def test_realtime_pacer_holds_each_frame_to_the_wall_clock() -> None:
    import time

    from hilrec.sim.recorder import Pacer

    pacer = Pacer(200)
    began = time.monotonic()
    for _ in range(20):
        pacer.wait()
    assert time.monotonic() - began >= 20 / 200


def test_extra_features_must_be_measurable() -> None:
    features = sim_features(
        {},
        extra={
            "observation.images.side": {
                "dtype": "video",
                "shape": [48, 64, 3],
                "names": ["height", "width", "channels"],
            }
        },
    )
    assert "observation.images.side" in features
    with pytest.raises(FeatureSpecError, match=r"cube_pos.*not measurable"):
        sim_features({}, extra={"observation.cube_pos": {"dtype": "float32", "shape": [3]}})


def test_gripper_observation_is_clipped_like_lerobot_range_0_100(twin: Twin) -> None:
    state = twin.reset(8).state.copy()
    low, high = twin.units.joint_ranges[5]
    for past_limit, expected in ((low - 0.01, 0.0), (high + 0.01, 100.0)):
        state[1 + 5] = past_limit  # mjSTATE_INTEGRATION: time, then qpos (gripper is joint 6)
        twin.set_state(state)
        assert twin.units.units_from_rad(np.full(6, past_limit))[5] != expected
        assert twin.observe()[5] == expected
