"""LeRobot 0.4.4 and hilrec agree on the format, both ways.

(a) LeRobot loads datasets written by the native writer and returns exactly what was written:
    numeric columns bit-equal (action, observation.state, timestamp, indices), and the frames at
    the timestamps LeRobot queries decode close to the originals.
(b) ``hilrec check`` accepts datasets written by LeRobot's own writer, with and without video.
(c) The same frames go into both sinks (native and LeRobot-backed); ``hilrec check`` passes on
    both outputs and their numeric contents are identical.

About (a) and video: ``LeRobotDataset(..., video_backend="pyav")`` decodes through
``torchvision.io.VideoReader``; the compat extra pins torch 2.8 / torchvision 0.23, which has it
(as does 0.25, the newest LeRobot's pins allow), so the frames below come out of LeRobot's own
``ds[i]`` decoding path, with its own timestamp tolerance check.

Nothing here reaches the network: HF_HUB_OFFLINE is set (tests/conftest.py) and every dataset is
opened from a local root.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from _frames import FPS, TASKS, episode_frames, features, stacked, write_dataset

from hilrec.daemon.dataset.check.checker import check_dataset
from hilrec.daemon.dataset.format import reader
from hilrec.daemon.dataset.format.sidecar import load_dataset_sidecar, load_episode_sidecar
from hilrec.daemon.dataset.writer.dataset_writer import DatasetWriter
from hilrec.daemon.dataset.writer.lerobot_sink import LeRobotSink
from hilrec.daemon.errors import DatasetError, DatasetStateError, FrameError
from hilrec.daemon.so101 import ROBOT_TYPE

os.environ.setdefault("HF_HUB_OFFLINE", "1")

CAM = "observation.images.front"
LENGTHS = [14, 9, 11]
# Mean absolute error per frame, in uint8 levels (0..255), between a decoded frame and the
# original. The frames are smooth gradients; libsvtav1 at crf 30 stays around 1-2 levels.
MAX_FRAME_MAE = 3.0
SINKS: dict[str, Callable[..., Any]] = {"native": DatasetWriter.create, "lerobot": LeRobotSink.create}


@pytest.fixture(scope="module")
def lerobot_dataset_class() -> Any:
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    return LeRobotDataset


@pytest.fixture(scope="module")
def datasets(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, bool], Path]:
    """(sink, with video) -> root; every dataset holds the same frames."""
    base = tmp_path_factory.mktemp("compat")
    roots = {}
    for sink, create in SINKS.items():
        for video in (True, False):
            root = base / f"{sink}-{'video' if video else 'plain'}"
            write_dataset(create, root, LENGTHS, cameras=("front",) if video else ())
            roots[(sink, video)] = root
    return roots


def expected_frames(video: bool) -> list[list[dict[str, Any]]]:
    return [episode_frames(e, n, cameras=("front",) if video else ()) for e, n in enumerate(LENGTHS)]


def load_lerobot(cls: Any, root: Path) -> Any:
    return cls(f"hilrec/{root.name}", root=root, video_backend="pyav")


# --- (a) LeRobot reads what the native writer wrote ---------------------------------------------


@pytest.mark.parametrize("video", [True, False], ids=["video", "plain"])
@pytest.mark.slow
def test_lerobot_loads_native_columns_bit_equal(
    datasets: dict, lerobot_dataset_class: Any, video: bool
) -> None:
    ds = load_lerobot(lerobot_dataset_class, datasets[("native", video)])
    assert ds.num_episodes == len(LENGTHS) and ds.num_frames == sum(LENGTHS) and ds.fps == FPS
    assert ds.meta.video_keys == ([CAM] if video else [])
    assert ds.meta.robot_type == ROBOT_TYPE
    assert [ds.meta.tasks.iloc[i].name for i in range(len(ds.meta.tasks))] == list(TASKS)
    frames = [f for episode in expected_frames(video) for f in episode]
    columns = ds.hf_dataset.with_format("numpy")[:]
    for key in ("action", "observation.state"):
        assert columns[key].dtype == np.float32
        assert columns[key].tobytes() == stacked(frames, key).tobytes()
    frame_index = np.concatenate([np.arange(n) for n in LENGTHS])
    assert columns["timestamp"].dtype == np.float32
    assert columns["timestamp"].tobytes() == (frame_index / FPS).astype(np.float32).tobytes()
    assert np.array_equal(columns["frame_index"], frame_index)
    assert np.array_equal(columns["index"], np.arange(sum(LENGTHS)))
    assert np.array_equal(columns["episode_index"], np.repeat(np.arange(3), LENGTHS))
    assert np.array_equal(columns["task_index"], np.repeat([0, 1, 0], LENGTHS))


def test_lerobot_getitem_returns_what_was_written(datasets: dict, lerobot_dataset_class: Any) -> None:
    ds = load_lerobot(lerobot_dataset_class, datasets[("native", False)])
    frames = [f for episode in expected_frames(False) for f in episode]
    for i, frame in enumerate(frames):
        item = ds[i]
        for key in ("action", "observation.state"):
            assert item[key].numpy().tobytes() == frame[key].tobytes(), (i, key)
        assert item["task"] == frame["task"]
        assert item["index"].item() == i


@pytest.mark.slow  # > 5 s (make test-fast leaves it out)
def test_lerobot_decodes_the_written_frames(datasets: dict, lerobot_dataset_class: Any) -> None:
    ds = load_lerobot(lerobot_dataset_class, datasets[("native", True)])
    frames = [f for episode in expected_frames(True) for f in episode]
    assert len(ds) == len(frames)
    for i, frame in enumerate(frames):
        item = ds[i]  # LeRobot's pyav decoder, nearest frame within ds.tolerance_s or it raises
        image = item[CAM]
        assert tuple(image.shape) == (3, *frame[CAM].shape[:2])
        decoded = (image.numpy().transpose(1, 2, 0) * 255.0).round().astype(np.int16)
        error = np.abs(decoded - frame[CAM]).mean()
        assert error < MAX_FRAME_MAE, (i, error)
        for key in ("action", "observation.state"):
            assert item[key].numpy().tobytes() == frame[key].tobytes(), (i, key)


# --- (b) hilrec check accepts LeRobot's own datasets --------------------------------------------


@pytest.mark.parametrize("video", [True, False], ids=["video", "plain"])
def test_check_accepts_lerobot_written_dataset(datasets: dict, video: bool) -> None:
    report = check_dataset(datasets[("lerobot", video)])
    assert [f.format() for f in report.failures] == []
    assert report.passed and report.summary["frames"] == sum(LENGTHS)


def test_check_accepts_lerobot_image_features_and_checks_their_stats(
    lerobot_dataset_class: Any, tmp_path: Path
) -> None:
    """Without video LeRobot stores camera frames as PNG in the parquet (dtype "image")."""
    root = tmp_path / "images"
    specs = features({"front": (96, 128)})
    specs[CAM]["dtype"] = "image"
    ds = lerobot_dataset_class.create(
        "hilrec/images",
        fps=FPS,
        root=root,
        robot_type=ROBOT_TYPE,
        use_videos=False,
        features={k: {**v, "shape": tuple(v["shape"])} for k, v in specs.items()},
    )
    for episode, length in enumerate(LENGTHS[:2]):
        for frame in episode_frames(episode, length, cameras=("front",)):
            ds.add_frame(dict(frame))
        ds.save_episode()
    ds.finalize()
    report = check_dataset(root)
    assert [f.format() for f in report.failures] == [] and report.passed

    episodes = root / "meta/episodes/chunk-000/file-000.parquet"
    table = pq.read_table(episodes)
    column = f"stats/{CAM}/mean"
    means = table.column(column).to_pylist()
    means[1][0][0][0] += 0.1
    field = table.schema.field(column)
    pq.write_table(
        table.set_column(table.schema.get_field_index(column), field, pa.array(means, type=field.type)),
        episodes,
    )
    failed = [f for f in check_dataset(root).failures if f.rule == "stats.episode"]
    assert [(f.episode, f.key) for f in failed] == [(1, CAM)]
    assert "mean[channel 0]" in failed[0].message


# --- (c) the same frames through both sinks ------------------------------------------------------


@pytest.mark.parametrize("video", [True, False], ids=["video", "plain"])
def test_both_sinks_pass_check_and_hold_the_same_numbers(datasets: dict, video: bool) -> None:
    native, lerobot = datasets[("native", video)], datasets[("lerobot", video)]
    for root in (native, lerobot):
        assert check_dataset(root).passed, root
    ours, theirs = reader.load_episodes(native), reader.load_episodes(lerobot)
    for row_ours, row_theirs in zip(ours, theirs, strict=True):
        for key in ("episode_index", "tasks", "length", "dataset_from_index", "dataset_to_index"):
            assert row_ours[key] == row_theirs[key], key
        if video:
            for key in (f"videos/{CAM}/from_timestamp", f"videos/{CAM}/to_timestamp"):
                assert row_ours[key] == pytest.approx(row_theirs[key], abs=1e-9), key
    assert reader.load_tasks(native) == reader.load_tasks(lerobot)
    for episode in range(len(LENGTHS)):
        a, b = reader.read_episode(native, episode), reader.read_episode(lerobot, episode)
        assert a.keys() == b.keys()
        for key in a:
            assert a[key].dtype == b[key].dtype and a[key].tobytes() == b[key].tobytes(), key
        if video:
            original = stacked(expected_frames(True)[episode], CAM)
            for root in (native, lerobot):
                decoded = reader.read_episode_frames(root, episode, CAM)
                assert np.abs(decoded.astype(np.int16) - original).mean() < MAX_FRAME_MAE


# --- the LeRobot-backed sink's own contract --------------------------------------------------------


def test_lerobot_sink_writes_sidecars_and_provenance(datasets: dict) -> None:
    root = datasets[("lerobot", False)]
    sidecar = load_dataset_sidecar(root)
    assert sidecar is not None
    writer = sidecar["writer"]
    assert writer["name"] == "lerobot" and writer["version"] == "0.4.4"
    meta, _ = load_episode_sidecar(root, 2)
    assert meta == {"seed": 2, "episode_index": 2, "has_arrays": False}


def test_lerobot_sink_discard_leaves_no_staged_frames(tmp_path: Path) -> None:
    root = tmp_path / "ds"
    with LeRobotSink.create(
        root, fps=FPS, features=features({"front": (96, 128)}), robot_type=ROBOT_TYPE
    ) as sink:
        for frame in episode_frames(5, 12, cameras=("front",)):
            sink.add_frame(frame)
        assert sink.episode_open
        sink.discard_episode()
        assert not sink.episode_open and sink.num_episodes == 0
        kept = episode_frames(0, 7, cameras=("front",))
        for frame in kept:
            sink.add_frame(frame)
        assert sink.save_episode() == 0 and sink.num_episodes == 1
    report = check_dataset(root)
    assert report.passed, [f.format() for f in report.failures]
    decoded = reader.read_episode_frames(root, 0, CAM)
    assert len(decoded) == 7
    assert np.abs(decoded.astype(np.int16) - stacked(kept, CAM)).mean() < MAX_FRAME_MAE


def test_lerobot_sink_with_libx264(tmp_path: Path) -> None:
    root = tmp_path / "ds"
    write_dataset(LeRobotSink.create, root, [8], cameras=("front",), video_codec="libx264")
    report = check_dataset(root)
    assert report.passed, [f.format() for f in report.failures]
    info = reader.load_info(root)
    assert info["features"][CAM]["info"]["video.codec"] == "h264"


def test_check_accepts_lerobot_streaming_encoder_output(tmp_path: Path) -> None:
    # LeRobot's streaming encoder counts pixels, not frames, in its image stats.
    root = tmp_path / "ds"
    write_dataset(LeRobotSink.create, root, [10, 7], cameras=("front",), streaming_encoding=True)
    counts = [e["stats"][CAM]["count"].item() for e in reader.load_episodes(root, with_stats=True)]
    assert counts == [10 * 96 * 128, 7 * 96 * 128]
    report = check_dataset(root)
    assert report.passed, [f.format() for f in report.failures]


def test_lerobot_sink_lifecycle_and_validation(tmp_path: Path) -> None:
    root = tmp_path / "ds"
    sink = LeRobotSink.create(root, fps=FPS, features=features(), robot_type=ROBOT_TYPE)
    with pytest.raises(DatasetStateError, match="no frame"):
        sink.save_episode()
    frame = episode_frames(0, 1)[0]
    with pytest.raises(FrameError, match="'action'"):
        sink.add_frame({**frame, "action": frame["action"].astype(np.float64)})
    with pytest.raises(FrameError, match="'timestamp'"):
        sink.add_frame({**frame, "timestamp": np.float32(0.0)})
    sink.add_frame(frame)
    with pytest.raises(DatasetStateError, match="episode open"):
        sink.finalize()
    sink.save_episode()
    sink.finalize()
    sink.finalize()  # harmless
    with pytest.raises(DatasetStateError, match="after finalize"):
        sink.add_frame(frame)
    with pytest.raises(DatasetError, match="already exists"):
        LeRobotSink.create(root, fps=FPS, features=features(), robot_type=ROBOT_TYPE)


def test_lerobot_sink_without_lerobot_is_a_clear_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "lerobot", None)  # as if it were not installed
    with pytest.raises(DatasetError, match="compatibility extra"):
        LeRobotSink.create(tmp_path / "ds", fps=FPS, features=features(), robot_type=ROBOT_TYPE)
    assert not (tmp_path / "ds").exists()


# --- (d) LeRobot's merge and the spelling of the video info -------------------------------------


@pytest.mark.slow  # > 5 s (make test-fast leaves it out)
def test_lerobot_merges_hilrec_with_its_own_and_loads_the_0_6_spelling(
    datasets: dict, lerobot_dataset_class: Any, tmp_path: Path
) -> None:
    """hilrec writes LeRobot 0.4.4's ``video.is_depth_map``: 0.4.4's ``aggregate_datasets``
    (every key of every feature compared) merges it with 0.4.4's own datasets. Re-spelled for
    LeRobot 0.6 (``hilrec edit for-lerobot``) it still loads here, but 0.4.4 no longer merges it
    with its own: the spelling is the user's choice of which LeRobot to merge with."""
    from lerobot.datasets.aggregate import aggregate_datasets

    from hilrec.daemon.dataset.video.codec import LeRobotInfo
    from hilrec.daemon.tools.edit_spelling import for_lerobot

    native, theirs = datasets[("native", True)], datasets[("lerobot", True)]
    merged = tmp_path / "merged"
    aggregate_datasets(
        ["hilrec/native", "lerobot/own"], "hilrec/merged", roots=[native, theirs], aggr_root=merged
    )
    ds = load_lerobot(lerobot_dataset_class, merged)
    assert ds.num_episodes == 2 * len(LENGTHS) and ds.num_frames == 2 * sum(LENGTHS)
    frames = [f for _ in range(2) for episode in expected_frames(True) for f in episode]
    for i in (0, sum(LENGTHS) - 1, sum(LENGTHS), len(frames) - 1):  # each side of the seam
        item = ds[i]
        decoded = (item[CAM].numpy().transpose(1, 2, 0) * 255.0).round().astype(np.int16)
        assert np.abs(decoded - frames[i][CAM]).mean() < MAX_FRAME_MAE, i
        assert item["action"].numpy().tobytes() == frames[i]["action"].tobytes(), i
    report = check_dataset(merged)
    assert not report.errors, [f.format() for f in report.errors]

    respelled = tmp_path / "for-0.6"
    for_lerobot(native, LeRobotInfo.V0_6, out=respelled)
    six = load_lerobot(lerobot_dataset_class, respelled)
    assert six.num_frames == sum(LENGTHS) and six.meta.video_keys == [CAM]
    assert tuple(six[sum(LENGTHS) - 1][CAM].shape) == (3, *expected_frames(True)[0][0][CAM].shape[:2])
    with pytest.raises(ValueError, match="Same features is expected"):
        aggregate_datasets(
            ["hilrec/six", "lerobot/own"],
            "hilrec/refused",
            roots=[respelled, theirs],
            aggr_root=tmp_path / "no",
        )
