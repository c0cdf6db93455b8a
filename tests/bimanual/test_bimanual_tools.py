"""render, coverage and eval on the two-arm dataset: the twelve columns, named per arm."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from hilrec.daemon.cli import main
from hilrec.daemon.dataset import load_episodes, load_info, read_episode
from hilrec.daemon.errors import DatasetError
from hilrec.daemon.so101 import ACTION_KEY, BIMANUAL_ROBOT_TYPE, STATE_KEY, joint_names, position_names
from hilrec.daemon.tools.coverage import dataset_states, measure, rollout_states
from hilrec.daemon.tools.evaluate import EvalConfig, evaluate
from hilrec.daemon.tools.policies import as_policy
from hilrec.sim.bimanual_scene import BimanualSceneConfig
from hilrec.sim.replay import replay_check

# Real daemons, processes or kill loops: the slow tier (make test runs it; make test-fast does not).
pytestmark = pytest.mark.slow


class ReplayPolicy:
    """The recorded actions of the dataset's episodes, one episode per reset."""

    def __init__(self, root: Path) -> None:
        self.actions = [
            read_episode(root, int(r["episode_index"]), [ACTION_KEY])[ACTION_KEY] for r in load_episodes(root)
        ]
        self.episode, self.frame = -1, 0

    def reset(self) -> None:
        self.episode, self.frame = self.episode + 1, 0

    def __call__(self, observation: dict[str, Any]) -> np.ndarray:
        assert observation[STATE_KEY].shape == (12,)
        actions = self.actions[self.episode]
        self.frame += 1
        return actions[min(self.frame - 1, len(actions) - 1)]


def test_render_redraws_a_wrist_camera_and_keeps_every_column(recorded: Path, tmp_path: Path) -> None:
    out = tmp_path / "rendered"
    argv = ["render", str(recorded), "--out", str(out), "--camera", "front,right_wrist", "--size", "32x24"]
    assert main(argv) == 0
    info = load_info(out)
    assert info["robot_type"] == BIMANUAL_ROBOT_TYPE
    assert "observation.images.right_wrist" in info["features"]
    for index in range(len(load_episodes(recorded))):
        before = read_episode(recorded, index, [ACTION_KEY, STATE_KEY])
        after = read_episode(out, index, [ACTION_KEY, STATE_KEY])
        for key in (ACTION_KEY, STATE_KEY):
            assert after[key].tobytes() == before[key].tobytes()
    assert replay_check(out).passed


def test_coverage_measures_twelve_joints_named_per_arm(recorded: Path, capsys: Any) -> None:
    assert main(["coverage", str(recorded), "--against-seeds", "0:2", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert all(name in joint_names(2) for name in report["grid"]["pair"])
    assert report["states"] > 0 and 0 < report["test"]["coverage"] <= 1
    # The dataset's own seeds (0-2) are what it holds: their roll-outs are covered exactly.
    data = dataset_states(recorded)
    assert data.values.shape[1] == 12 and data.names == joint_names(2)
    same = measure(data, str(recorded), test=rollout_states(range(3), arms=2))
    assert same.test_coverage == 1.0
    with pytest.raises(DatasetError, match="12"):
        measure(data, str(recorded), test=rollout_states(range(1)))
    with pytest.raises(DatasetError, match="left_gripper"):
        measure(data, str(recorded), pair=["gripper", "elbow_flex"])


def test_eval_replays_the_expert_on_the_two_arm_twin(recorded: Path) -> None:
    config = EvalConfig(seeds=(0, 1, 2), cameras=(), max_seconds=12.0, scene=BimanualSceneConfig())
    report = evaluate(config, as_policy(ReplayPolicy(recorded)))
    assert [e.success for e in report.episodes] == [True, True, True]


def test_eval_command_with_two_arms_records_replayable_twelve_column_episodes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    (tmp_path / "hold_both.py").write_text(
        textwrap.dedent(
            """
            class Hold:
                def reset(self):
                    self.first = None

                def __call__(self, observation):
                    if self.first is None:
                        self.first = observation["observation.state"].copy()
                    return self.first
            """
        )
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    root = tmp_path / "evaluated"
    argv = ["eval", "--arms", "2", "--policy", "hold_both:Hold", "--seeds", "3:5", "--pushes", "3"]
    argv += ["--max-seconds", "1", "--cameras", "left_wrist", "--size", "32x24", "--record", str(root)]
    assert main([*argv, "--video-codec", "libx264", "--json", "--no-progress"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["episodes"] == 2 and report["successes"] == 0
    info = load_info(root)
    assert info["robot_type"] == BIMANUAL_ROBOT_TYPE and info["features"][STATE_KEY]["shape"] == [12]
    assert sum(e["pushes"] for e in report["per_episode"]) > 0  # pushes land on prefixed links too
    assert replay_check(root).passed
    bad = ["eval", "--arms", "2", "--policy", "hold_both:Hold", "--seeds", "3:4", "--cameras", "wrist"]
    assert main([*bad, "--no-progress"]) != 0
    assert "unknown camera wrist" in capsys.readouterr().err


def test_export_writes_both_arms_state_and_actions(recorded: Path, tmp_path: Path) -> None:
    import h5py

    out = tmp_path / "both.hdf5"
    assert main(["export", str(recorded), "--format", "robomimic", "--out", str(out)]) == 0
    with h5py.File(out) as exported:
        demo = exported["data/demo_0"]
        state = read_episode(recorded, 0, [STATE_KEY])[STATE_KEY]
        assert demo["obs/state"].shape == demo["actions"].shape == (len(state), 12)
        np.testing.assert_array_equal(demo["obs/state"][:], state)
        action = read_episode(recorded, 0, [ACTION_KEY])[ACTION_KEY]
        np.testing.assert_array_equal(demo["actions"][:], action)
        # Which values are which arm's travels with the file: LeRobot's bi_so_follower names.
        names = json.loads(exported["data"].attrs["env_args"])["env_kwargs"]["names"]
        assert names["obs/state"] == names["actions"] == position_names(2)


def test_eval_refuses_an_arm_count_the_policy_was_not_trained_on() -> None:
    from hilrec.daemon.errors import ConfigError
    from hilrec.daemon.tools.cmd_eval import _arms

    assert _arms(None, 2) == 2 and _arms(None, None) == 1 and _arms(2, None) == 2
    with pytest.raises(ConfigError, match="trained on 2 arm"):
        _arms(1, 2)
