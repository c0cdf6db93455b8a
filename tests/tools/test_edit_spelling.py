"""``hilrec edit for-lerobot`` and ``merge`` across the two LeRobot spellings of video ``info``.

LeRobot 0.4.4 writes ``video.is_depth_map``, 0.6.1 ``is_depth_map`` (and its encoder settings);
each one's ``aggregate_datasets`` refuses features that differ there. What LeRobot 0.6.1 itself
does with these datasets is ``make compat-latest``'s (tests/compat_latest/root_write.py).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

from hilrec.daemon.cli import main
from hilrec.daemon.dataset.check.checker import check_dataset
from hilrec.daemon.dataset.format.reader import load_info, read_episode
from hilrec.daemon.dataset.video.codec import LeRobotInfo
from hilrec.daemon.dataset.writer.dataset_writer import DatasetWriter
from hilrec.daemon.errors import DatasetError
from hilrec.daemon.so101 import ACTION_KEY, STATE_KEY, so101_features
from hilrec.daemon.tools import edit
from hilrec.daemon.tools.edit_spelling import ENCODER_INFO_KEYS, for_lerobot

CAM = "observation.images.front"
H, W = 48, 64


def make_dataset(root: Path, lengths: tuple[int, ...] = (10, 7)) -> Path:
    rng = np.random.default_rng(len(root.name))
    with DatasetWriter.create(
        root,
        fps=25,
        features=so101_features({"front": (H, W)}),
        robot_type="so_follower",
        video_codec="libx264",
    ) as writer:
        for length in lengths:
            for i in range(length):
                image = np.full((H, W, 3), 20 * i % 255, np.uint8)
                writer.add_frame(
                    {
                        ACTION_KEY: rng.normal(size=6).astype(np.float32),
                        STATE_KEY: rng.normal(size=6).astype(np.float32),
                        CAM: image,
                        "task": "pick",
                    }
                )
            writer.save_episode()
    return root


def cam_info(root: Path) -> dict:
    return dict(load_info(root)["features"][CAM]["info"])


def set_cam_info(root: Path, info: dict) -> None:
    """As another writer (LeRobot 0.6.1) leaves info.json."""
    path = root / "meta/info.json"
    data = json.loads(path.read_text())
    data["features"][CAM]["info"] = info
    path.write_text(json.dumps(data, indent=4))


@pytest.fixture(scope="module")
def hilrec_dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_dataset(tmp_path_factory.mktemp("spelling") / "a")


def test_hilrec_writes_lerobot_0_4_spelling_and_for_lerobot_respells_both_ways(
    hilrec_dataset: Path, tmp_path: Path
) -> None:
    original = cam_info(hilrec_dataset)
    assert original["video.is_depth_map"] is False and "is_depth_map" not in original
    assert LeRobotInfo.of(original) == LeRobotInfo.V0_4
    six = tmp_path / "six"
    report = for_lerobot(hilrec_dataset, LeRobotInfo.V0_6, out=six)
    info = cam_info(six)
    assert info["is_depth_map"] is False and "video.is_depth_map" not in info
    assert list(info)[-1] == "is_depth_map"  # where 0.6.1's get_video_info puts it
    assert report.videos_linked == 1 and report.frames_reencoded == 0
    assert not check_dataset(six).failures  # the checker reads both spellings
    for e in range(2):
        assert (
            read_episode(six, e)[STATE_KEY].tobytes() == read_episode(hilrec_dataset, e)[STATE_KEY].tobytes()
        )
    # and back, in place: exactly what hilrec (and LeRobot 0.4.4) write, key order included
    assert main(["edit", "for-lerobot", str(six), "--version", "0.4"]) == 0
    assert list(cam_info(six).items()) == list(original.items())


def test_for_lerobot_0_4_drops_lerobot_0_6_encoder_settings(hilrec_dataset: Path, tmp_path: Path) -> None:
    six = tmp_path / "six"
    for_lerobot(hilrec_dataset, LeRobotInfo.V0_6, out=six)
    encoder = {"video.g": 2, "video.crf": 30, "video.preset": 12, "video.fast_decode": 0}
    set_cam_info(six, {**cam_info(six), **encoder, "video.extra_options": {}, "video.video_backend": "pyav"})
    back = tmp_path / "back"
    report = for_lerobot(six, LeRobotInfo.V0_4, out=back)
    assert list(cam_info(back).items()) == list(cam_info(hilrec_dataset).items())
    assert any("video.crf" in note and "dropped" in note for note in report.notes), report.notes


def test_merge_accepts_both_spellings_and_differing_encoder_settings(
    hilrec_dataset: Path, tmp_path: Path
) -> None:
    other = make_dataset(tmp_path / "other", (6,))
    for_lerobot(other, LeRobotInfo.V0_6)
    set_cam_info(other, {**cam_info(other), "video.crf": 30, "video.g": 2})
    merged = tmp_path / "merged"
    report = edit.merge([hilrec_dataset, other], merged)
    assert report.episodes == 3
    info = cam_info(merged)
    assert list(info.items()) == list(cam_info(hilrec_dataset).items())  # the first's: 0.4.4's
    six = tmp_path / "merged6"
    edit.merge([hilrec_dataset, other], six, lerobot=LeRobotInfo.V0_6)
    info = cam_info(six)
    assert LeRobotInfo.of(info) == LeRobotInfo.V0_6
    assert info["video.crf"] is None and info["video.g"] is None  # the inputs disagree: emptied


def test_merge_still_names_a_real_info_difference(hilrec_dataset: Path, tmp_path: Path) -> None:
    other = make_dataset(tmp_path / "other", (6,))
    set_cam_info(other, {**cam_info(other), "video.codec": "av1"})
    with pytest.raises(DatasetError, match=r"feature 'observation.images.front' differs .* in \['info'\]"):
        edit.merge([hilrec_dataset, other], tmp_path / "merged")
    assert not os.path.lexists(tmp_path / "merged")
    assert not ENCODER_INFO_KEYS & {"video.codec", "video.pix_fmt", "video.height"}
