"""The encoder worker process: lowest priority, shared-memory ring, spill fallback, same bytes."""

from __future__ import annotations

import os
import time
from pathlib import Path

import av
import numpy as np
import pytest
from _frames import front_camera_writer
from support import wait_until

from hilrec.daemon.dataset.video.codec import EpisodeVideoEncoder, VideoSettings, probe_video
from hilrec.daemon.dataset.video.encoder_process import RING_ENV, EncoderProcess
from hilrec.daemon.dataset.video.encoder_worker import SHM_DIR, segment_path
from hilrec.daemon.dataset.video.spill import SpillFile
from hilrec.daemon.errors import VideoEncodingError

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
        # Every thread of it: those that imports started before it lowered itself, the codec's.
        tasks = [int(tid) for tid in os.listdir(f"/proc/{worker.pid}/task")]
        schedulers = sorted({found for tid in tasks if (found := _scheduler(tid)) is not None})
        policy = "SCHED_IDLE" if schedulers == [os.SCHED_IDLE] else f"policies {schedulers}"
        assert worker.backlog_frames == 0
        # Where SCHED_IDLE was granted, what every thread runs at; elsewhere what it could get.
        return out, encoded, policy if worker.priority == "SCHED_IDLE" else worker.priority, through_ring
    finally:
        worker.close()


def _scheduler(tid: int) -> int | None:
    """The thread's policy; None for one that ended since the listing (a codec thread may)."""
    try:
        return os.sched_getscheduler(tid)
    except ProcessLookupError:
        return None


@pytest.mark.parametrize("codec", ["libx264", "libsvtav1"])
@pytest.mark.slow
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


@pytest.mark.slow
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


def test_the_worker_is_out_of_the_terminals_group_but_in_the_writers_session() -> None:
    """Its own process group keeps a terminal's Ctrl-C from it; the writer's session keeps it in
    the writer's scheduling group, where SCHED_IDLE yields (a session of its own took a whole
    session's CPU share from the kernel worker that moves a pty's bytes)."""
    worker = EncoderProcess("cam", fps=FPS, height=H, width=W, settings=VideoSettings(codec="libx264"))
    try:
        assert os.getpgid(worker.pid) == worker.pid != os.getpgid(0)
        assert os.getsid(worker.pid) == os.getsid(0)
    finally:
        worker.close()


def test_the_worker_starts_no_process_of_its_own() -> None:
    """Attaching the ring through ``SharedMemory`` started a resource tracker beside every worker
    (one more interpreter per camera and daemon), only to unregister the segment from it."""
    worker = EncoderProcess("cam", fps=FPS, height=H, width=W, settings=VideoSettings(codec="libx264"))
    try:
        wait_until(lambda: worker.priority != "starting", 60, what="the worker's ready event")
        tasks = Path(f"/proc/{worker.pid}/task")
        children = [pid for task in tasks.iterdir() for pid in (task / "children").read_text().split()]
        assert children == []
    finally:
        worker.close()


def shm_free_bytes() -> int:
    stat = os.statvfs(SHM_DIR)
    return stat.f_blocks * stat.f_frsize


def segment_size(name: str) -> int:
    try:
        return (Path(SHM_DIR) / name).stat().st_size
    except FileNotFoundError:  # another process's, gone meanwhile
        return 0


def test_a_ring_dev_shm_cannot_hold_is_refused_before_any_frame(tmp_path: Path) -> None:
    """Only ftruncated, the ring SIGBUSed the daemon at the first frame tmpfs could not back."""
    before = set(os.listdir(SHM_DIR))
    # More than the whole of /dev/shm: tmpfs refuses the reservation at once, with nothing
    # taken from the other users of the machine's shared memory meanwhile.
    too_big = shm_free_bytes() + (64 << 20)
    with pytest.raises(VideoEncodingError, match=r"cam.*shared-memory ring.*/dev/shm.*MB free"):
        EncoderProcess(
            "cam", fps=FPS, height=H, width=W, settings=VideoSettings(codec="libx264"), ring_bytes=too_big
        )
    # Other processes on the machine make segments too: the refused one is known by its size.
    left = [n for n in set(os.listdir(SHM_DIR)) - before if segment_size(n) >= too_big]
    assert left == [], "the refused segment is unlinked"


def test_a_writer_with_no_room_for_the_ring_records_with_the_thread_encoder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from hilrec.daemon.dataset.format.reader import read_episode

    monkeypatch.setenv(RING_ENV, str(shm_free_bytes() + (64 << 20)))
    root = tmp_path / "ds"
    with caplog.at_level("WARNING"):
        writer = front_camera_writer(root, (H, W))
    assert writer.video_encoder == "thread"
    assert "encoding in threads" in caplog.text and "/dev/shm" in caplog.text
    rng = np.random.default_rng(0)
    for image in frames(10):
        writer.add_frame(
            {
                "action": rng.normal(size=6).astype(np.float32),
                "observation.state": rng.normal(size=6).astype(np.float32),
                "observation.images.front": image,
                "task": "pick",
            }
        )
    writer.save_episode()
    writer.finalize()
    assert len(read_episode(root, 0)["action"]) == 10
    video = next((root / "videos" / "observation.images.front").rglob("*.mp4"))
    assert probe_video(video).frames == 10


def test_a_closed_worker_leaves_no_shared_memory_behind(tmp_path: Path) -> None:
    """The ring's numpy views made shm.close() raise, and the unlink after it never ran."""
    worker = EncoderProcess("cam", fps=FPS, height=H, width=W, settings=VideoSettings(codec="libx264"))
    segment = Path(segment_path(worker._shm.name))
    try:
        assert segment.exists()
        spill = SpillFile(tmp_path / "cam.spill", H * W * 3)
        future = worker.begin(0, tmp_path / "cam.mp4", spill.path)
        for k, image in enumerate(frames(5)):
            assert worker.offer(0, k, image) >= 0
        worker.end(0, 5)
        assert future.result(120) == 5
        spill.close()
    finally:
        worker.close()
    assert not segment.exists()


def test_a_job_failing_after_its_cut_still_puts_every_later_frame_into_the_spill(tmp_path: Path) -> None:
    """The ring frames after a failed job's cut were released untouched: its spill had holes
    that a save would have read back as black frames."""
    from hilrec.daemon.dataset.video.spill import read_spill_frame

    images = frames(16)
    worker = EncoderProcess("cam", fps=FPS, height=H, width=W, settings=VideoSettings(codec="libx264"))
    try:
        (tmp_path / "episode").mkdir()
        spill = SpillFile(tmp_path / "episode" / "cam.spill", H * W * 3)
        future = worker.begin(0, tmp_path / "episode" / "cam.mp4", spill.path)
        for k in range(5):
            assert worker.offer(0, k, images[k]) >= 0
        # Frame 5 said to be in the spill but never written there: the job is cut, then fails.
        worker.send_spilled(0, 5)
        for k in range(6, 16):
            assert worker.offer(0, k, images[k]) >= 0
        worker.end(0, 16)
        with pytest.raises(VideoEncodingError, match="frame 5 is not in the spill"):
            future.result(120)
        cut = worker.cut_of(0)
        assert cut is not None and cut <= 5  # the writer's request, in the header, may come first
        for k in range(6, 16):
            assert np.array_equal(read_spill_frame(spill.path, k, H * W * 3, (H, W, 3)), images[k]), k
        spill.close()
    finally:
        worker.close()


def test_a_worker_that_cannot_start_leaves_no_shared_memory_behind(monkeypatch: pytest.MonkeyPatch) -> None:
    """The segment was made before the worker started, and kept when it could not start."""
    import sys

    ring_bytes = 7 * H * W * 3  # a size no other segment on the machine has, to know it by
    size = 64 + ring_bytes
    before = set(os.listdir(SHM_DIR))
    monkeypatch.setattr(sys, "executable", "/nonexistent/python")
    with pytest.raises(FileNotFoundError):
        EncoderProcess(
            "cam", fps=FPS, height=H, width=W, settings=VideoSettings(codec="libx264"), ring_bytes=ring_bytes
        )
    assert [n for n in set(os.listdir(SHM_DIR)) - before if segment_size(n) == size] == []


@pytest.mark.slow
def test_takes_discarded_as_they_start_never_fail_and_the_next_is_saved(tmp_path: Path) -> None:
    """A discard races the worker creating its mp4 in the episode's directory (rmdir then met
    ENOTEMPTY: 'Directory not empty .episode-000000.tmp'); every discard must succeed."""
    from hilrec.daemon.dataset.format.reader import read_episode

    root = tmp_path / "ds"
    writer = front_camera_writer(root, (H, W), video_encoder="process")
    row = {
        "action": np.zeros(6, dtype=np.float32),
        "observation.state": np.zeros(6, dtype=np.float32),
        "task": "pick",
    }
    for take in range(20):
        for image in frames(1 + take % 3):
            writer.add_frame({**row, "observation.images.front": image})
        writer.discard_episode()
    for image in frames(5):
        writer.add_frame({**row, "observation.images.front": image})
    writer.save_episode()
    writer.finalize()
    assert len(read_episode(root, 0)["action"]) == 5
    assert not [p.name for p in root.rglob(".episode-*")]
