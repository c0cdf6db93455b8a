"""The pyarrow/PyAV reader returns exactly what was written, and names the file it cannot read."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from _frames import FPS, IMAGE_SIZE, TASKS, stacked, write_dataset

from hilrec.daemon.dataset.format import reader
from hilrec.daemon.dataset.format.stats import STAT_KEYS
from hilrec.daemon.dataset.writer.dataset_writer import DatasetWriter
from hilrec.daemon.errors import CorruptDatasetError, DatasetError

CAM = "observation.images.front"
LENGTHS = [11, 7, 13]
# Mean absolute error, in uint8 levels, a decoded frame may have against the original. The test
# frames are smooth gradients; libsvtav1 at LeRobot's crf 30 stays near 1-2 levels on them.
MAX_FRAME_MAE = 3.0


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[list[dict]]]:
    root = tmp_path_factory.mktemp("reader") / "ds"
    frames = write_dataset(DatasetWriter.create, root, LENGTHS, cameras=("front",))
    return root, frames


@pytest.mark.slow
def test_read_episode_is_bit_equal_in_stored_dtype(written: tuple[Path, list[list[dict]]]) -> None:
    root, frames = written
    offset = 0
    for episode, expected in enumerate(frames):
        columns = reader.read_episode(root, episode)
        n = len(expected)
        assert set(columns) == {
            "action",
            "observation.state",
            "timestamp",
            "frame_index",
            "episode_index",
            "index",
            "task_index",
        }
        for key in ("action", "observation.state"):
            assert columns[key].dtype == np.float32 and columns[key].shape == (n, 6)
            assert columns[key].tobytes() == stacked(expected, key).tobytes()
        assert columns["timestamp"].dtype == np.float32
        assert np.array_equal(columns["timestamp"], (np.arange(n) / FPS).astype(np.float32))
        assert np.array_equal(columns["frame_index"], np.arange(n))
        assert np.array_equal(columns["episode_index"], np.full(n, episode))
        assert np.array_equal(columns["index"], np.arange(offset, offset + n))
        assert np.array_equal(columns["task_index"], np.full(n, episode % 2))
        offset += n


def test_read_episode_selected_columns(written: tuple[Path, list[list[dict]]]) -> None:
    root, frames = written
    columns = reader.read_episode(root, 2, columns=["observation.state"])
    assert list(columns) == ["observation.state"]
    assert columns["observation.state"].tobytes() == stacked(frames[2], "observation.state").tobytes()
    with pytest.raises(DatasetError, match="not a numeric feature"):
        reader.read_episode(root, 0, columns=[CAM])
    with pytest.raises(DatasetError, match="no episode 9"):
        reader.read_episode(root, 9)


@pytest.mark.slow
def test_metadata(written: tuple[Path, list[list[dict]]]) -> None:
    root, _ = written
    info = reader.load_info(root)
    assert info["fps"] == FPS and info["total_episodes"] == 3
    assert reader.load_tasks(root) == {0: TASKS[0], 1: TASKS[1]}
    episodes = reader.load_episodes(root)
    assert [e["episode_index"] for e in episodes] == [0, 1, 2]
    assert [e["length"] for e in episodes] == LENGTHS
    assert not any(k.startswith("stats/") or k == "stats" for k in episodes[0])
    with_stats = reader.load_episodes(root, with_stats=True)
    assert set(with_stats[1]["stats"]["action"]) == set(STAT_KEYS)
    assert with_stats[1]["stats"]["action"]["count"].tolist() == [LENGTHS[1]]
    stats = reader.load_stats(root)
    assert stats is not None and stats["index"]["max"].tolist() == [sum(LENGTHS) - 1]


def test_video_probe_and_decode(written: tuple[Path, list[list[dict]]]) -> None:
    root, frames = written
    episodes = reader.load_episodes(root)
    probe = reader.probe_video(reader.video_file_path(root, reader.load_info(root), episodes[0], CAM))
    assert probe.num_frames == sum(LENGTHS) and probe.fps == FPS
    assert (probe.height, probe.width) == IMAGE_SIZE
    for episode in (0, 2):
        decoded = reader.read_episode_frames(root, episode, CAM)
        original = stacked(frames[episode], CAM)
        assert decoded.shape == original.shape and decoded.dtype == np.uint8
        errors = np.abs(decoded.astype(np.int16) - original).mean(axis=(1, 2, 3))
        assert errors.max() < MAX_FRAME_MAE, errors
        # A frame from the neighbouring timestamp is clearly further away: the match is real.
        assert np.abs(decoded[1:].astype(np.int16) - original[:-1]).mean() > 2 * errors.mean()
    some = reader.read_episode_frames(root, 1, CAM, frame_indices=[6, 0])
    assert np.abs(some.astype(np.int16) - stacked(frames[1], CAM)[[6, 0]]).mean() < MAX_FRAME_MAE


def test_parquet_without_footer_names_the_file(
    written: tuple[Path, list[list[dict]]], tmp_path: Path
) -> None:
    root, _ = written
    data = (root / "data/chunk-000/file-000.parquet").read_bytes()
    broken = tmp_path / "file-000.parquet"
    broken.write_bytes(data[:-100])
    with pytest.raises(CorruptDatasetError) as caught:
        reader.read_parquet(broken)
    assert caught.value.path == str(broken) and "parquet" in caught.value.problem
    with pytest.raises(CorruptDatasetError) as caught:
        reader.read_episode_rows(broken, 0, ["action"])
    assert caught.value.path == str(broken)


def test_missing_or_bad_info_names_the_file(tmp_path: Path) -> None:
    with pytest.raises(CorruptDatasetError, match=r"meta/info.json: missing"):
        reader.load_info(tmp_path)
    (tmp_path / "meta").mkdir()
    (tmp_path / "meta/info.json").write_text('{"fps": 25')
    with pytest.raises(CorruptDatasetError, match="unreadable JSON"):
        reader.load_info(tmp_path)


@pytest.mark.slow
def test_reader_imports_neither_lerobot_nor_pandas() -> None:
    code = (
        "import sys, hilrec.daemon.dataset.format.reader, hilrec.daemon.dataset.check.checker; "
        "print(sorted(m for m in ('lerobot', 'torch', 'pandas', 'datasets') "
        "if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], check=False, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
