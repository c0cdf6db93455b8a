"""``hilrec repair``: orphan temp files, truncated parquet, wrong info.json counts, unsaved episodes."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from hilrec.daemon.cli import main as cli_main
from hilrec.daemon.dataset.reader import column_to_numpy
from hilrec.daemon.dataset.repair import repair
from hilrec.daemon.dataset.sidecar import load_episode_sidecar
from hilrec.daemon.dataset.writer import DatasetWriter
from hilrec.daemon.so101 import so101_features

FPS = 25
H, W = 32, 48
CAM = "observation.images.front"
LENGTHS = (12, 9, 15)


def frames_of(episode: int, length: int) -> list[dict]:
    rng = np.random.default_rng(episode)
    return [
        {
            "action": rng.normal(size=6).astype(np.float32),
            "observation.state": rng.normal(size=6).astype(np.float32),
            CAM: np.full((H, W, 3), 20 * episode + i, np.uint8),
            "task": f"task {episode}",
        }
        for i in range(length)
    ]


@pytest.fixture()
def dataset(tmp_path: Path) -> Path:
    root = tmp_path / "ds"
    with DatasetWriter.create(
        root,
        fps=FPS,
        features=so101_features({"front": (H, W)}),
        robot_type="so_follower",
        video_codec="libx264",
    ) as writer:
        for episode, length in enumerate(LENGTHS):
            for frame in frames_of(episode, length):
                writer.add_frame(frame)
            writer.save_episode(sidecar={"episode": episode})
    return root


def read_actions(root: Path) -> dict[int, np.ndarray]:
    info = json.loads((root / "meta/info.json").read_text())
    out: dict[int, list[np.ndarray]] = {}
    for path in sorted((root / "data").glob("chunk-*/file-*.parquet")):
        table = pq.read_table(path)
        episodes = column_to_numpy(table.column("episode_index"))
        actions = column_to_numpy(table.column("action"))
        for e in np.unique(episodes):
            out.setdefault(int(e), []).append(actions[episodes == e])
    assert sorted(out) == list(range(info["total_episodes"]))
    return {e: np.concatenate(parts) for e, parts in out.items()}


def expected_actions(episode: int) -> np.ndarray:
    return np.stack([f["action"] for f in frames_of(episode, LENGTHS[episode])])


def test_a_clean_dataset_needs_nothing(dataset: Path) -> None:
    report = repair(dataset)
    assert report.exit_code == 0 and report.kept == [0, 1, 2] and not report.rebuilt


def test_orphan_temp_files_are_removed(dataset: Path) -> None:
    (dataset / "meta/.info.json.tmp-4242").write_text("{")
    (dataset / "data/chunk-000/file-000.parquet.hilrec-new").write_bytes(b"PAR1")
    report = repair(dataset)
    assert report.exit_code == 0
    assert not (dataset / "meta/.info.json.tmp-4242").exists()
    assert not (dataset / "data/chunk-000/file-000.parquet.hilrec-new").exists()
    assert len(report.actions) == 2


def test_a_truncated_data_parquet_is_rebuilt_from_the_journal(dataset: Path) -> None:
    path = dataset / "data/chunk-000/file-000.parquet"
    path.write_bytes(path.read_bytes()[:-200])  # footer gone
    report = repair(dataset)
    assert report.rebuilt and report.exit_code == 0 and report.kept == [0, 1, 2]
    actions = read_actions(dataset)
    for episode in range(3):
        assert np.array_equal(actions[episode], expected_actions(episode))
    assert list((dataset / "hilrec").glob("damaged-*/data/chunk-000/file-000.parquet"))


def test_without_a_journal_the_episodes_of_a_broken_file_are_dropped_and_reported(dataset: Path) -> None:
    shutil.rmtree(dataset / "hilrec/journal")
    video = dataset / f"videos/{CAM}/chunk-000/file-000.mp4"
    video.write_bytes(video.read_bytes()[: video.stat().st_size // 3])
    report = repair(dataset)
    assert report.exit_code == 3 and report.rebuilt
    assert {d["episode"] for d in report.dropped} <= {0, 1, 2} and report.dropped
    info = json.loads((dataset / "meta/info.json").read_text())
    assert info["total_episodes"] == len(report.kept)
    for old, new in zip(report.kept, range(len(report.kept)), strict=True):
        assert np.array_equal(read_actions(dataset)[new], expected_actions(old))
        meta, _ = load_episode_sidecar(dataset, new)
        assert meta is not None and meta["episode"] == old


def test_info_counts_that_disagree_with_the_files_are_fixed(dataset: Path) -> None:
    info_path = dataset / "meta/info.json"
    info = json.loads(info_path.read_text())
    info["total_frames"] = 999
    info_path.write_text(json.dumps(info))
    report = repair(dataset)
    assert report.exit_code == 0
    fixed = json.loads(info_path.read_text())
    assert fixed["total_frames"] == sum(LENGTHS) and fixed["total_episodes"] == 3


def test_an_unsaved_episode_is_dropped_and_its_sidecar_removed(dataset: Path) -> None:
    writer = DatasetWriter.open(dataset, video_codec="libx264")
    for frame in frames_of(0, 5):
        writer.add_frame(frame)
    # Simulate the process dying here: the open episode's directory stays behind.
    episode = writer._episode
    assert episode is not None
    open_dir = episode.directory
    for encoder in episode.encoders.values():
        encoder.finish(timeout=60)
    (dataset / "hilrec/episodes/episode-000003.json").write_text('{"episode_index": 3}')
    assert open_dir.exists()
    report = repair(dataset)
    assert report.exit_code == 3
    assert report.dropped[0]["episode"] == 3 and report.dropped[0]["video_frames_on_disk"][CAM] == 5
    assert not open_dir.exists()
    assert not (dataset / "hilrec/episodes/episode-000003.json").exists()
    assert read_actions(dataset).keys() == {0, 1, 2}


def test_the_command_prints_json_and_uses_mcap_exit_codes(dataset: Path, capsys) -> None:
    assert cli_main(["repair", str(dataset), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["kept_episodes"] == [0, 1, 2] and out["dropped"] == []
    shutil.rmtree(dataset / "hilrec/journal")
    (dataset / "data/chunk-000/file-000.parquet").write_bytes(b"PAR1 truncated")
    assert cli_main(["repair", str(dataset)]) == 3
    text = capsys.readouterr().out
    assert "DROPPED episode 0" in text and "3 episode(s) dropped" in text
    assert cli_main(["repair", str(dataset.parent / "nothing-here")]) == 2
