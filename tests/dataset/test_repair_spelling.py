"""``hilrec repair`` keeps the LeRobot spelling of a video feature's ``info`` when it rewrites it.

A dataset re-spelled for LeRobot 0.6.1 (``hilrec edit for-lerobot ROOT --version 0.6``) merges only
with 0.6.1's datasets; a repair that set its ``info`` back to 0.4.4's ``video.is_depth_map`` would
silently undo that. The damage here (a wrong size or rate in the ``info`` block) is the kind repair
fixes by setting the whole block from the videos.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from _frames import front_camera_writer

from hilrec.daemon.cli import main
from hilrec.daemon.dataset.check.checker import check_dataset
from hilrec.daemon.dataset.format.reader import load_info
from hilrec.daemon.dataset.video.codec import LeRobotInfo
from hilrec.daemon.so101 import ACTION_KEY, STATE_KEY

# Real daemons, processes or kill loops: the slow tier (make test runs it; make test-fast does not).
pytestmark = pytest.mark.slow

FPS = 25
H, W = 32, 48
CAM = "observation.images.front"
LENGTHS = (8, 6)
INFO_PATH = "meta/info.json"


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("spelling") / "ds"
    rng = np.random.default_rng(7)
    with front_camera_writer(root, (H, W)) as writer:
        for episode, length in enumerate(LENGTHS):
            for i in range(length):
                writer.add_frame(
                    {
                        ACTION_KEY: rng.normal(size=6).astype(np.float32),
                        STATE_KEY: rng.normal(size=6).astype(np.float32),
                        CAM: np.full((H, W, 3), 20 * episode + 3 * i, np.uint8),
                        "task": f"task {episode}",
                    }
                )
            writer.save_episode()
    return root


def cam_info(root: Path) -> dict:
    return dict(load_info(root)["features"][CAM]["info"])


def damage_cam_info(root: Path, key: str, value: int) -> None:
    path = root / INFO_PATH
    info = json.loads(path.read_text())
    assert key in info["features"][CAM]["info"]
    info["features"][CAM]["info"][key] = value
    path.write_text(json.dumps(info, indent=4))


def run_repair(root: Path) -> tuple[int, dict]:
    """``hilrec repair ROOT --json`` as the user runs it: its own process."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "hilrec.daemon.cli", "repair", str(root), "--json"],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=False,
    )
    assert "Traceback" not in done.stderr, done.stderr
    report = json.loads(done.stdout)
    assert report["exit_code"] == done.returncode
    return done.returncode, report


@pytest.mark.parametrize("spelling", list(LeRobotInfo), ids=lambda s: f"lerobot-{s.value}")
@pytest.mark.parametrize(("damaged", "wrong"), [("video.height", H + 16), ("video.fps", FPS + 5)])
def test_repair_sets_the_video_info_from_the_videos_in_the_datasets_spelling(
    recorded: Path, tmp_path: Path, spelling: LeRobotInfo, damaged: str, wrong: int
) -> None:
    root = tmp_path / "ds"
    shutil.copytree(recorded, root, symlinks=True)
    if spelling != LeRobotInfo.V0_4:  # hilrec itself writes 0.4.4's spelling
        assert main(["edit", "for-lerobot", str(root), "--version", spelling.value]) == 0
    respelled = cam_info(root)
    assert LeRobotInfo.of(respelled) == spelling
    other = next(s for s in LeRobotInfo if s != spelling)
    damage_cam_info(root, damaged, wrong)
    assert not check_dataset(root).passed

    rc, report = run_repair(root)

    assert rc == 0, report
    assert any(f"features.{CAM}.info set from the videos" in a for a in report["actions"]), report
    info = cam_info(root)
    assert info[spelling.depth_key] is False and other.depth_key not in info, info
    assert LeRobotInfo.of(info) == spelling
    # exactly the block that spelling's LeRobot writes, its key order included
    assert list(info.items()) == list(respelled.items())
    assert check_dataset(root).passed
