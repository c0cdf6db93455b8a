"""A hardware dataset's lost mp4: ``hilrec repair --without-missing-video`` keeps the rows (issue 23, item 7).

Without the flag, every episode of the lost file is dropped (its frames of that camera are gone,
and a dataset has one feature set); with it, the camera is removed from the dataset and every
episode keeps its rows and its other cameras. The report says which.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from hilrec.daemon.dataset.check.checker import check_dataset
from hilrec.daemon.dataset.format.reader import load_episodes, load_info, read_episode
from hilrec.daemon.dataset.writer.dataset_writer import DatasetWriter
from hilrec.daemon.so101 import ACTION_KEY, ROBOT_TYPE, so101_features

LOST = "observation.images.wrist"
KEPT = "observation.images.front"


def repair(root: Path, *flags: str) -> tuple[int, dict]:
    done = subprocess.run(
        [sys.executable, "-m", "hilrec.daemon.cli", "repair", str(root), "--json", *flags],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    return done.returncode, json.loads(done.stdout)


@pytest.mark.slow  # > 5 s (make test-fast leaves it out)
def test_a_lost_camera_file_keeps_every_episode_only_with_the_flag(tmp_path: Path) -> None:
    root = tmp_path / "hw"
    rng = np.random.default_rng(3)
    actions = {}
    with DatasetWriter.create(
        root,
        fps=25,
        features=so101_features({"front": (32, 48), "wrist": (32, 48)}),
        robot_type=ROBOT_TYPE,
        video_codec="libx264",
    ) as writer:
        for episode in range(4):
            actions[episode] = rng.normal(size=(20, 6)).astype(np.float32)
            for action in actions[episode]:
                writer.add_frame(
                    {
                        "action": action,
                        "observation.state": action,
                        "task": "pick",
                        KEPT: rng.integers(0, 255, (32, 48, 3), dtype=np.uint8),
                        LOST: rng.integers(0, 255, (32, 48, 3), dtype=np.uint8),
                    }
                )
            writer.save_episode()
    (root / f"videos/{LOST}/chunk-000/file-000.mp4").unlink()
    plain = tmp_path / "plain"
    shutil.copytree(root, plain)

    code, report = repair(plain)
    assert code == 3 and [e for e in report["episodes"] if e.get("new_index") is not None] == [], report

    code, report = repair(root, "--without-missing-video")
    assert code == 0, report
    assert any(f"camera '{LOST}' removed" in action for action in report["actions"]), report
    assert check_dataset(root).passed
    assert [int(row["length"]) for row in load_episodes(root)] == [20] * 4
    features = load_info(root)["features"]
    assert LOST not in features and KEPT in features
    for episode in range(4):
        np.testing.assert_array_equal(read_episode(root, episode, [ACTION_KEY])[ACTION_KEY], actions[episode])
