"""A two-arm hardware recording (LeRobot's ``bi_so_follower`` columns) is replay-checked arm by
arm, and the daemon's verdict names the arm that went wrong."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from _recordings import TASK, Frozen, RecordingSpec, add_hilrec_metadata, make_twin, record

from hilrec.daemon.control.judge import judge_episode
from hilrec.daemon.dataset import EpisodeVerdict
from hilrec.daemon.replay.check import replay_dataset
from hilrec.daemon.replay.results import ReplayVerdict
from hilrec.daemon.replay.settings import ReplaySettings
from hilrec.daemon.so101 import ACTION_KEY, STATE_KEY, robot_type, so101_features

CLEAN = RecordingSpec(seed=0, frames=100)
JAMMED = RecordingSpec(seed=10, frames=100, frozen=Frozen("elbow_flex", 60))


def _two_arm_dataset(root: Path, left: RecordingSpec, right: RecordingSpec) -> Path:
    """One episode: each arm a one-arm recording on the twin, side by side, left first."""
    from hilrec.daemon.dataset.writer.dataset_writer import DatasetWriter

    twin = make_twin()
    arms = [record(spec, twin) for spec in (left, right)]
    features = so101_features(arms=2)
    with DatasetWriter.create(root, fps=twin.fps, features=features, robot_type=robot_type(2)) as writer:
        for t in range(left.frames):
            writer.add_frame(
                {
                    ACTION_KEY: np.concatenate([a.action[t] for a in arms]),
                    STATE_KEY: np.concatenate([a.state[t] for a in arms]),
                    "task": TASK,
                }
            )
        writer.save_episode(arrays={"leader": np.concatenate([a.action for a in arms], axis=1)})
    add_hilrec_metadata(root, twin)
    return root


@pytest.fixture(scope="module")
def right_jammed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _two_arm_dataset(tmp_path_factory.mktemp("two-arms") / "ds", CLEAN, JAMMED)


def test_each_arm_of_a_two_arm_recording_replays_on_its_own(right_jammed: Path) -> None:
    verdicts = {}
    for arm in ("left", "right"):
        check = replay_dataset(right_jammed, settings=ReplaySettings(), settings_source="defaults", arm=arm)
        verdicts[arm] = check.results[0].verdict
    assert verdicts == {"left": ReplayVerdict.CONSISTENT, "right": ReplayVerdict.DIVERGED}
    # Without an arm, twelve columns are not one arm's six: refused, never judged by halves.
    whole = replay_dataset(right_jammed, settings=ReplaySettings(), settings_source="defaults")
    assert whole.results[0].verdict is ReplayVerdict.NOT_REPLAYABLE


@pytest.mark.parametrize(("left", "right", "bad"), [(CLEAN, JAMMED, "right"), (JAMMED, CLEAN, "left")])
@pytest.mark.slow
def test_the_verdict_judges_each_arm_and_names_the_bad_one(
    tmp_path: Path, left: RecordingSpec, right: RecordingSpec, bad: str
) -> None:
    root = _two_arm_dataset(tmp_path / "ds", left, right)
    verdict = judge_episode(root, 0, mode="emulated")
    assert verdict["verdict"] == EpisodeVerdict.BAD, verdict
    assert verdict["summary"].startswith(f"{bad} arm: elbow_flex"), verdict["summary"]
    replay = verdict["details"]["replay"]
    good = "left" if bad == "right" else "right"
    assert replay["arm"] == bad and replay["arms"][good]["verdict"] == EpisodeVerdict.SOUND
    assert replay["arms"][bad]["plot"].endswith(f"-{bad}.png")


@pytest.mark.slow
def test_a_sound_two_arm_take_says_so_for_each_arm(tmp_path: Path) -> None:
    root = _two_arm_dataset(tmp_path / "ds", CLEAN, RecordingSpec(seed=2, frames=100))
    verdict = judge_episode(root, 0, mode="emulated")
    assert verdict["verdict"] == EpisodeVerdict.SOUND, verdict
    assert "left arm consistent with the twin" in verdict["summary"]
    assert "right arm consistent with the twin" in verdict["summary"]


def test_check_replay_checks_each_arm_and_fails_on_the_bad_one(
    right_jammed: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import json

    from hilrec.daemon.cli import main

    assert main(["check", str(right_jammed), "--replay", "--workers", "1"]) == 1
    text = capsys.readouterr().out
    assert "left arm: replay check: hardware replay check" in text
    assert "left arm: replay check" in text and "right arm: replay check" in text
    left, right = text.split("right arm: ")[0], text.split("right arm: ")[1]
    assert "replay PASSED: 1 consistent" in left and "replay FAILED: 1 diverged" in right
    assert main(["check", str(right_jammed), "--replay", "--workers", "1", "--json"]) == 1
    document = json.loads(capsys.readouterr().out)["replay"]
    assert document["passed"] is False
    assert {arm: section["passed"] for arm, section in document["arms"].items()} == {
        "left": True,
        "right": False,
    }
