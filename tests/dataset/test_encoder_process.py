"""The encoder worker process: lowest priority, shared-memory ring, spill fallback, same bytes."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from hilrec.daemon.dataset.encoder_process import EncoderProcess
from hilrec.daemon.dataset.spill import SpillFile
from hilrec.daemon.dataset.video import EpisodeVideoEncoder, VideoSettings, probe_video

FPS = 25
H, W = 48, 64


@pytest.fixture(autouse=True)
def _encoder_processes(monkeypatch: pytest.MonkeyPatch) -> None:
    """These tests are about the encoder processes, which are opt-in."""
    monkeypatch.setenv("HILREC_VIDEO_ENCODER", "process")


def frames(count: int) -> list[np.ndarray]:
    rng = np.random.default_rng(7)
    return [rng.integers(0, 255, (H, W, 3), dtype=np.uint8) for _ in range(count)]


def thread_encode(path: Path, images: list[np.ndarray], settings: VideoSettings) -> None:
    encoder = EpisodeVideoEncoder(
        path, key="cam", episode_index=0, fps=FPS, height=H, width=W, settings=settings
    )
    for image in images:
        encoder.put(image)
    encoder.finish(timeout=60)


def process_encode(
    tmp: Path, images: list[np.ndarray], settings: VideoSettings, ring_bytes: int
) -> tuple[Path, int, str, int]:
    worker = EncoderProcess("cam", fps=FPS, height=H, width=W, settings=settings, ring_bytes=ring_bytes)
    try:
        spill = SpillFile(tmp / "cam.spill", H * W * 3)
        out = tmp / "process.mp4"
        future = worker.begin(0, out, spill.path)
        through_ring = 0
        for k, image in enumerate(images):
            spill.append(image)
            through_ring += worker.put(0, k, image)
        spill.close()
        worker.end(0, len(images))
        encoded = future.result(120)
        scheduler = os.sched_getscheduler(worker.pid)
        policy = {os.SCHED_IDLE: "SCHED_IDLE"}.get(scheduler, str(scheduler))
        assert worker.backlog_frames == 0
        return out, encoded, policy if policy == "SCHED_IDLE" else worker.priority, through_ring
    finally:
        worker.close()


@pytest.mark.parametrize("codec", ["libx264", "libsvtav1"])
def test_the_worker_writes_the_bytes_the_thread_encoder_writes(tmp_path: Path, codec: str) -> None:
    images = frames(40)
    settings = VideoSettings(codec=codec)
    thread_encode(tmp_path / "thread.mp4", images, settings)
    out, encoded, priority, through_ring = process_encode(tmp_path, images, settings, 1 << 24)
    assert encoded == 40 and probe_video(out).frames == 40
    assert priority in ("SCHED_IDLE", "nice 19")
    assert through_ring == 40
    assert out.read_bytes() == (tmp_path / "thread.mp4").read_bytes()


def test_frames_the_ring_cannot_hold_are_read_from_the_spill(tmp_path: Path) -> None:
    images = frames(60)
    settings = VideoSettings(codec="libx264")
    thread_encode(tmp_path / "thread.mp4", images, settings)
    # Two slots: the writer outruns the worker, so most frames go through the spill.
    out, encoded, _priority, through_ring = process_encode(tmp_path, images, settings, 2 * H * W * 3)
    assert encoded == 60
    assert through_ring < 60
    assert out.read_bytes() == (tmp_path / "thread.mp4").read_bytes()


def test_a_dead_worker_fails_the_episode_loudly(tmp_path: Path) -> None:
    worker = EncoderProcess("cam", fps=FPS, height=H, width=W, settings=VideoSettings(codec="libx264"))
    try:
        spill = SpillFile(tmp_path / "cam.spill", H * W * 3)
        future = worker.begin(3, tmp_path / "x.mp4", spill.path)
        os.kill(worker.pid, 9)
        with pytest.raises(Exception, match="cam"):
            future.result(60)
        spill.close()
    finally:
        worker.close()
    assert not worker.alive
