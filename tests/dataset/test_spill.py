"""The video spill: saves durable before the encode, the backlog, the disk bound, the catch-up."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import hilrec.daemon.dataset.episode as episode_module
from hilrec.daemon.dataset import journal
from hilrec.daemon.dataset.reader import read_episode
from hilrec.daemon.dataset.spill import SPILL_META, finish_spilled_encodes, pending_spills
from hilrec.daemon.dataset.video import probe_video
from hilrec.daemon.dataset.writer import DatasetWriter
from hilrec.daemon.errors import SpillFullError
from hilrec.daemon.so101 import so101_features

FPS = 25
H, W = 48, 64
CAM = "observation.images.front"
FRAME_BYTES = H * W * 3


@pytest.fixture(autouse=True)
def _encoder_processes(monkeypatch: pytest.MonkeyPatch) -> None:
    """These tests are about the encoder processes, which are opt-in."""
    monkeypatch.setenv("HILREC_VIDEO_ENCODER", "process")


def frame(rng: np.random.Generator) -> dict:
    return {
        "action": rng.normal(size=6).astype(np.float32),
        "observation.state": rng.normal(size=6).astype(np.float32),
        CAM: rng.integers(0, 255, (H, W, 3), dtype=np.uint8),
        "task": "pick",
    }


def create(root: Path, **kwargs) -> DatasetWriter:
    return DatasetWriter.create(
        root,
        fps=FPS,
        features=so101_features({"front": (H, W)}),
        robot_type="so_follower",
        video_codec="libx264",
        **kwargs,
    )


def test_a_save_is_durable_with_its_spill_and_the_encode_catches_up(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(episode_module, "FINISH_WAIT_S", 0.0)  # never wait for the encoder
    root = tmp_path / "ds"
    rng = np.random.default_rng(0)
    writer = create(root)
    assert writer.video_encoder == "process"
    sent = []
    for length in (30, 20):
        frames = [frame(rng) for _ in range(length)]
        sent.append(frames)
        for f in frames:
            writer.add_frame(f)
        assert writer.video_backlog_s() >= 0.0
        writer.save_episode()
    assert writer.wait_videos(timeout=120)
    assert writer.video_backlog_s() == 0.0
    assert writer.spill_bytes == 0
    writer.finalize()
    assert pending_spills(root) == []
    for index, frames in enumerate(sent):
        columns = read_episode(root, index)
        assert np.array_equal(columns["action"], np.stack([f["action"] for f in frames]))
        assert not (journal.episode_dir(root, index) / SPILL_META).exists()
    video = next((root / "videos" / CAM).rglob("*.mp4"))
    assert probe_video(video).frames == 50


def test_the_spill_bound_refuses_a_frame_loudly_and_a_new_take(tmp_path: Path) -> None:
    root = tmp_path / "ds"
    rng = np.random.default_rng(1)
    writer = create(root, spill_bytes_limit=10 * FRAME_BYTES)
    try:
        for _ in range(10):
            writer.add_frame(frame(rng))
        assert writer.spill_bytes == 10 * FRAME_BYTES
        assert writer.spill_problem() is not None  # one more take of 60 s cannot fit
        with pytest.raises(SpillFullError, match="spill_bytes_limit"):
            writer.add_frame(frame(rng))
        writer.save_episode()
        assert writer.wait_videos(timeout=120)
        assert writer.spill_bytes == 0
    finally:
        writer.finalize()
    assert read_episode(root, 0)["action"].shape == (10, 6)


def test_the_in_process_encoder_is_still_there(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HILREC_VIDEO_ENCODER", "thread")
    root = tmp_path / "ds"
    rng = np.random.default_rng(2)
    with create(root) as writer:
        assert writer.video_encoder == "thread"
        for _ in range(12):
            writer.add_frame(frame(rng))
        writer.save_episode()
        assert writer.video_backlog_s() == 0.0
        assert writer.spill_problem() is None
    assert read_episode(root, 0)["action"].shape == (12, 6)


def test_a_dead_worker_costs_no_frame(tmp_path: Path) -> None:
    """The worker dies mid-take: frames go on into the spill, the save is durable, the writer
    encodes the episode from the spill, and no new take is allowed until it has a worker."""
    import os
    import signal

    root = tmp_path / "ds"
    rng = np.random.default_rng(3)
    writer = create(root)
    frames = [frame(rng) for _ in range(30)]
    for f in frames[:10]:
        writer.add_frame(f)
    worker = writer._workers[CAM]
    os.kill(worker.pid, signal.SIGKILL)
    worker._reader.join(30)
    assert writer.spill_problem() is not None
    for f in frames[10:]:
        writer.add_frame(f)
    writer.save_episode()
    assert writer.wait_videos(timeout=120)
    writer.finalize()
    assert pending_spills(root) == []
    assert np.array_equal(read_episode(root, 0)["action"], np.stack([f["action"] for f in frames]))
    video = next((root / "videos" / CAM).rglob("*.mp4"))
    assert probe_video(video).frames == 30


def test_finish_spilled_encodes_is_a_no_op_on_a_clean_root(tmp_path: Path) -> None:
    root = tmp_path / "ds"
    rng = np.random.default_rng(4)
    with create(root) as writer:
        for _ in range(5):
            writer.add_frame(frame(rng))
        writer.save_episode()
    assert finish_spilled_encodes(root) == []
