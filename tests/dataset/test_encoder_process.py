"""The encoder worker process: lowest priority, shared-memory ring, spill fallback, same bytes."""

from __future__ import annotations

import os
import time
from pathlib import Path

import av
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
    """Hand ``images`` over as OpenEpisode.add does: the ring, else the spill."""
    worker = EncoderProcess("cam", fps=FPS, height=H, width=W, settings=settings, ring_bytes=ring_bytes)
    try:
        # As in the journal: the episode's directory, parts of a cut episode beside it.
        (tmp / "episode").mkdir()
        spill = SpillFile(tmp / "episode" / "cam.spill", H * W * 3)
        out = tmp / "episode" / "process.mp4"
        future = worker.begin(0, out, spill.path)
        through_ring = 0
        for k, image in enumerate(images):
            if worker.offer(0, k, image) >= 0:
                through_ring += 1
            else:
                spill.write_at(k, image)
                worker.send_spilled(0, k)
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


def test_frames_the_ring_cannot_hold_go_through_the_spill_and_the_parts_are_joined(tmp_path: Path) -> None:
    """Two slots: the writer outruns the worker, so frames go to the spill, the episode is cut
    (the frames encoded so far closed into one part, the rest encoded into another) and the two
    parts are joined into one mp4 holding every frame, in order."""
    images = frames(60)
    settings = VideoSettings(codec="libx264")
    out, encoded, _priority, through_ring = process_encode(tmp_path, images, settings, 2 * H * W * 3)
    assert encoded == 60
    assert through_ring < 60
    with av.open(str(out)) as container:
        decoded = [f.to_ndarray(format="rgb24") for f in container.decode(video=0)]
    assert len(decoded) == 60
    # Lossy, but each decoded frame is nearer its own source than the next one's.
    for k in range(59):
        own = np.abs(decoded[k].astype(int) - images[k]).mean()
        other = np.abs(decoded[k].astype(int) - images[k + 1]).mean()
        assert own < other, k
    assert probe_video(out).frames == 60
    assert not list(tmp_path.glob(".encode-*")), "the parts are removed after the join"
    assert sorted(p.name for p in (tmp_path / "episode").iterdir()) == ["cam.spill", "process.mp4"]


def test_an_episode_never_behind_spills_nothing(tmp_path: Path) -> None:
    images = frames(40)
    _out, encoded, _priority, through_ring = process_encode(
        tmp_path, images, VideoSettings(codec="libx264"), 1 << 24
    )
    assert (encoded, through_ring) == (40, 40)
    assert (tmp_path / "episode" / "cam.spill").stat().st_blocks == 0


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


def test_ctrl_c_is_the_writers_the_worker_goes_on(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    """Ctrl-C reaches the whole foreground process group; a worker that died of it would lose
    the take's frames and print SVT-AV1's "deinit called without sending EOS!"."""
    import signal

    worker = EncoderProcess("cam", fps=FPS, height=H, width=W, settings=VideoSettings(codec="libsvtav1"))
    try:
        (tmp_path / "episode").mkdir()
        spill = SpillFile(tmp_path / "episode" / "cam.spill", H * W * 3)
        future = worker.begin(0, tmp_path / "episode" / "cam.mp4", spill.path)
        images = frames(20)
        for k, image in enumerate(images[:10]):
            assert worker.offer(0, k, image) >= 0
        deadline = time.monotonic() + 60
        while worker.priority == "starting":  # its handlers are set once it says it is ready
            assert time.monotonic() < deadline
            time.sleep(0.01)
        os.kill(worker.pid, signal.SIGINT)
        for k, image in enumerate(images[10:], start=10):
            assert worker.offer(0, k, image) >= 0
        worker.end(0, 20)
        assert future.result(120) == 20
        assert worker.alive
        spill.close()
    finally:
        worker.close()
    assert "Svt[error]" not in capfd.readouterr().err
