"""``hilrec record --sim --policy M:F --takeover expert``: a policy drives the twin, the scripted
expert takes over when it strays; the episodes are labelled, replay bit for bit, and load in
LeRobot 0.4.4 with the ``intervention`` column."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from hilrec.daemon.cli import main
from hilrec.daemon.dataset.format.reader import load_info, read_episode
from hilrec.daemon.dataset.format.sidecar import load_episode_sidecar
from hilrec.daemon.policy.record import SOURCE_CODES, ControlSource
from hilrec.sim.replay import replay_check

POLICIES = Path(__file__).with_name("_policies.py")
EPISODES = 2


@pytest.fixture(scope="module")
def rollout(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("rollout") / "ds"
    code = main(
        [
            "record", "--sim", "--root", str(root), "--episodes", str(EPISODES), "--seed", "3",
            "--cameras", "none", "--no-progress",
            "--policy", f"{POLICIES}:hold_still", "--takeover", "expert",
        ]
    )  # fmt: skip
    assert code == 0
    return root


def test_episodes_begin_with_the_policy_and_end_with_the_expert(rollout: Path) -> None:
    info = load_info(rollout)
    assert info["features"]["intervention"]["dtype"] == "bool"
    assert info["features"]["intervention"]["shape"] == [1]
    for episode in range(EPISODES):
        rows = read_episode(rollout, episode, ["intervention", "action"])
        intervention = rows["intervention"].reshape(-1)
        assert not intervention[0] and intervention[-1]
        first_human = int(np.argmax(intervention))
        assert intervention[first_human:].all()  # the expert keeps the arm once it has it
        sidecar, _ = load_episode_sidecar(rollout, episode)
        assert sidecar is not None
        assert sidecar["success"] is True
        summary = sidecar["rollout"]
        assert summary["takeovers"] == 1 and summary["handbacks"] == 0
        assert summary["outcome"] == "success"
        assert 0 < summary["human_share"] < 1
        assert summary["switches"][0]["frame"] == first_human
        # The switch's goal step, measured from the recorded actions, within the per-tick clamp.
        action = rows["action"].astype(np.float64)
        step = float(np.abs(action[first_human] - action[first_human - 1]).max())
        assert step == pytest.approx(summary["switches"][0]["goal_step"], abs=1e-6)
        assert step <= summary["max_relative_target"]


def test_beside_the_dataset_every_frame_has_the_policy_and_the_expert(rollout: Path) -> None:
    rows = read_episode(rollout, 0, ["intervention", "observation.state"])
    _, arrays = load_episode_sidecar(rollout, 0)
    n = len(rows["intervention"])
    assert arrays["policy_action"].shape == (n, 6) and arrays["expert_action"].shape == (n, 6)
    human = arrays["control_source"] == SOURCE_CODES[ControlSource.HUMAN]
    np.testing.assert_array_equal(human, rows["intervention"].reshape(-1))
    # hold_still proposes the observed joints, on the human's frames too.
    np.testing.assert_array_equal(arrays["policy_action"], rows["observation.state"])
    # In line, one chunk of one goal per frame, each fresh and used at its own frame.
    assert (arrays["action_age_ticks"] == 0).all() and arrays["chunk_fresh"].all()
    assert np.isfinite(arrays["inference_latency_s"]).all()


def test_rollout_replays_bit_for_bit(rollout: Path) -> None:
    report = replay_check(rollout)
    assert report.passed, report.format_text()
    assert main(["check", str(rollout), "--replay"]) == 0


def test_lerobot_loads_the_intervention_column(rollout: Path) -> None:
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    ds = LeRobotDataset("hilrec/rollout", root=rollout, video_backend="pyav")
    assert "intervention" in ds.features
    first, last = ds[0], ds[len(ds) - 1]
    assert not bool(first["intervention"].item()) and bool(last["intervention"].item())


def test_a_policy_that_cannot_load_leaves_no_dataset(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tmp_path / "ds"
    code = main(
        ["record", "--sim", "--root", str(root), "--episodes", "1", "--cameras", "none", "--no-progress",
         "--policy", f"{POLICIES}:no_such_policy"]
    )  # fmt: skip
    assert code != 0
    assert "--policy" in capsys.readouterr().err
    assert not root.exists() or not any(root.iterdir())
