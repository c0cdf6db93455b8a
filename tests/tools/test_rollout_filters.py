"""A rollout's episodes selected and measured by who drove them: ``hilrec edit keep
--with-corrections`` / ``--outcome``, ``hilrec coverage --by-source``, and what the verdict
says of a rollout (its takeovers, where, and whether the policy kept the rate)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from hilrec.daemon.cli import main
from hilrec.daemon.control.judge_rollout import STARVED_WARN_SHARE, rollout_findings
from hilrec.daemon.dataset.check.checker import check_dataset
from hilrec.daemon.dataset.format.reader import load_episodes
from hilrec.daemon.dataset.format.sidecar import load_episode_sidecar
from hilrec.daemon.dataset.writer.dataset_writer import DatasetWriter
from hilrec.daemon.errors import FlagError
from hilrec.daemon.policy.record import INTERVENTION_KEY, intervention_feature
from hilrec.daemon.so101 import ACTION_KEY, STATE_KEY, so101_features
from hilrec.daemon.tools import edit

FPS = 25
# Per episode: frames, the first human frame (None: the policy drove it all), the mark.
EPISODES = ((20, None, True), (24, 10, False), (18, 6, True), (16, None, None))


def make_rollout(root: Path) -> Path:
    features = {**so101_features({}), INTERVENTION_KEY: intervention_feature()}
    with DatasetWriter.create(root, fps=FPS, features=features, robot_type="so_follower") as writer:
        for number, (length, human_from, success) in enumerate(EPISODES):
            human = np.zeros(length, dtype=bool)
            if human_from is not None:
                human[human_from:] = True
            for i in range(length):
                # The policy's states near 0, the human's near 50: far apart in every joint.
                state = np.full(6, 50.0 if human[i] else 0.0, dtype=np.float32) + np.float32(i * 0.01)
                writer.add_frame(
                    {
                        ACTION_KEY: state,
                        STATE_KEY: state,
                        INTERVENTION_KEY: np.array([human[i]]),
                        "task": "t",
                    }
                )
            switches = [] if human_from is None else [{"frame": human_from, "to": "human", "goal_step": 1.0}]
            writer.save_episode(
                sidecar={
                    "task": "t",
                    "success": success,
                    "frames": length,
                    "rollout": {
                        "frames": length,
                        "takeovers": len(switches),
                        "human_share": float(human.mean()),
                        "switches": switches,
                        "starved_ticks": 0,
                    },
                    "number": number,
                }
            )
    return root


@pytest.fixture(scope="module")
def rollout(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_rollout(tmp_path_factory.mktemp("rollout") / "ds")


def numbers(root: Path) -> list[int]:
    return [
        int((load_episode_sidecar(root, int(r["episode_index"]))[0] or {})["number"])
        for r in load_episodes(root)
    ]


def test_keep_with_corrections_and_by_outcome(rollout: Path, tmp_path: Path) -> None:
    corrected = tmp_path / "corrected"
    assert main(["edit", "keep", str(rollout), "--with-corrections", "--out", str(corrected)]) == 0
    assert numbers(corrected) == [1, 2]
    assert check_dataset(corrected).passed
    failed = tmp_path / "failed"
    assert main(["edit", "keep", str(rollout), "--outcome", "failure", "--out", str(failed)]) == 0
    assert numbers(failed) == [1]
    both = tmp_path / "both"
    edit.keep_episodes(rollout, with_corrections=True, outcome="success", out=both)
    assert numbers(both) == [2]
    with pytest.raises(FlagError, match="--outcome"):
        edit.keep_episodes(rollout, outcome="maybe", out=tmp_path / "bad")


def test_coverage_by_source_compares_the_humans_frames_with_the_policys(
    rollout: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["coverage", str(rollout), "--by-source", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    human = sum(n - h for n, h, _ in EPISODES if h is not None)
    policy = sum(n for n, _, _ in EPISODES) - human
    assert report["by_source"] == {"human_frames": human, "policy_frames": policy}
    assert report["states"] == human and report["test"]["states"] == policy
    assert report["test"]["coverage"] == 0.0  # the policy went where no human frame is
    far = report["test"]["farthest"][0]
    # Frames counted within the episode, not within the policy's rows.
    assert far["kind"] == "episode" and far["frame"] < EPISODES[far["number"]][0]


def test_coverage_by_source_refuses_a_dataset_without_intervention(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tmp_path / "plain"
    with DatasetWriter.create(root, fps=FPS, features=so101_features({}), robot_type="so_follower") as writer:
        for _ in range(3):
            writer.add_frame(
                {ACTION_KEY: np.zeros(6, np.float32), STATE_KEY: np.zeros(6, np.float32), "task": "t"}
            )
        writer.save_episode()
    assert main(["coverage", str(root), "--by-source"]) == 2
    err = capsys.readouterr().err
    assert "flag --by-source:" in err and "no 'intervention' column" in err, err


def test_the_verdict_says_where_the_human_took_over_and_whether_the_rate_was_kept() -> None:
    meta = {
        "frames": 100,
        "rollout": {
            "frames": 100,
            "human_share": 0.4,
            "switches": [
                {"frame": 50, "to": "human"},
                {"frame": 80, "to": "policy"},
                {"frame": 90, "to": "human"},
            ],
            "starved_ticks": 2,
            "inference_latency_s": {"p50": 0.01, "p99": 0.03},
        },
        "success": False,
    }
    found = rollout_findings(meta, FPS)
    assert found is not None
    assert "took over 2 time(s) (at 2 s, 3.6 s), 40% of frames" in found.sentence
    assert "kept the rate (2 of 100 ticks starved, inference p99 30 ms)" in found.sentence
    assert found.note is None and found.details["outcome"] == "failure"
    starved = int(100 * STARVED_WARN_SHARE) + 1
    meta["rollout"]["starved_ticks"] = starved  # type: ignore[index]
    late = rollout_findings(meta, FPS)
    assert late is not None and late.note is not None and "missed the rate" in late.sentence
    assert rollout_findings({"frames": 3}, FPS) is None  # no policy drove it
