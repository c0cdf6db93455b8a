"""The video spill: saves durable before the encode, the backlog, the disk bound, the catch-up."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import av
import numpy as np
import pytest

import hilrec.daemon.dataset.writer.episode as episode_module
from hilrec.daemon.dataset.check.checker import check_dataset
from hilrec.daemon.dataset.format.reader import read_episode
from hilrec.daemon.dataset.store import journal
from hilrec.daemon.dataset.store.spilled import finish_spilled_encodes, pending_spills
from hilrec.daemon.dataset.video.codec import probe_video
from hilrec.daemon.dataset.video.encoder_process import RING_ENV
from hilrec.daemon.dataset.video.spill import SPILL_META
from hilrec.daemon.dataset.writer import backlog
from hilrec.daemon.dataset.writer.dataset_writer import DatasetWriter
from hilrec.daemon.errors import DiskFullError, SpillFullError, VideoEncodingError
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


@pytest.mark.slow
def test_a_save_is_durable_with_its_spill_and_the_encode_catches_up(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(episode_module, "FINISH_WAIT_S", 0.0)  # never wait for the encoder
    root = tmp_path / "ds"
    rng = np.random.default_rng(0)
    hooks: list[str] = []
    writer = create(root, hook=hooks.append)
    assert writer.video_encoder == "process"
    sent = []
    for length in (30, 20):
        frames = [frame(rng) for _ in range(length)]
        sent.append(frames)
        with stopped(writer):  # behind for sure: the save cannot have its mp4 yet
            for f in frames:
                writer.add_frame(f)
            assert writer.video_backlog_s() > 0.0
            writer.save_episode()
    # Both saves went through the spill (not the mp4 the worker had ready).
    assert hooks.count("spill-synced") == 2
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


def wait_caught_up(writer: DatasetWriter) -> None:
    worker = writer._workers[CAM]
    deadline = time.monotonic() + 60
    while worker.backlog_frames:
        assert time.monotonic() < deadline, "the encoder process never caught up"
        time.sleep(0.01)


@contextlib.contextmanager
def stopped(writer: DatasetWriter) -> Iterator[None]:
    """The encoder process frozen: behind for sure, whatever the machine's speed."""
    pid = writer._workers[CAM].pid
    os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(pid, signal.SIGCONT)


@pytest.mark.slow
def test_the_spill_bound_refuses_a_frame_loudly_and_the_take_saves_up_to_there(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(RING_ENV, str(2 * FRAME_BYTES))
    root = tmp_path / "ds"
    rng = np.random.default_rng(1)
    writer = create(root, spill_bytes_limit=10 * FRAME_BYTES)
    kept = []
    try:
        with stopped(writer):
            with pytest.raises(SpillFullError, match="spill_bytes_limit"):
                for _ in range(100):
                    f = frame(rng)
                    writer.add_frame(f)
                    kept.append(f)
            # Two in the ring, the rest spilled up to the bound (whole pages on disk).
            assert 2 + 8 <= len(kept) <= 2 + 10
            assert writer.spill_problem() is not None  # one more take of 60 s cannot fit
        writer.save_episode()
        assert writer.wait_videos(timeout=120)
        assert writer.spill_bytes == 0
        assert writer.spill_problem() is None
    finally:
        writer.finalize()
    assert np.array_equal(read_episode(root, 0)["action"], np.stack([f["action"] for f in kept]))
    video = next((root / "videos" / CAM).rglob("*.mp4"))
    assert probe_video(video).frames == len(kept)


@pytest.mark.slow
def test_frames_spill_only_while_the_encoder_is_behind(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A take the encoder keeps up with writes no spill; one it falls behind in is cut where it
    fell behind, saved durable with the frames from there in its spill, and joined after."""
    monkeypatch.setattr(episode_module, "FINISH_WAIT_S", 0.0)  # a save never waits for the mp4
    monkeypatch.setenv(RING_ENV, str(2 * FRAME_BYTES))
    root = tmp_path / "ds"
    rng = np.random.default_rng(5)
    writer = create(root)
    try:
        for _ in range(10):
            writer.add_frame(frame(rng))
            wait_caught_up(writer)
        assert writer.spill_bytes == 0  # never behind: nothing on disk
        with stopped(writer):
            for _ in range(20):
                writer.add_frame(frame(rng))
            assert writer.spill_bytes >= 18 * FRAME_BYTES  # two in the ring
        writer.save_episode()
        directory = journal.episode_dir(root, 0)
        meta = json.loads((directory / SPILL_META).read_text())
        assert meta["cuts"] == {CAM: 10}  # the 10 frames encoded before it fell behind
        assert writer.wait_videos(timeout=120)
        assert not (directory / SPILL_META).exists()
    finally:
        writer.finalize()
    video = next((root / "videos" / CAM).rglob("*.mp4"))
    assert probe_video(video).frames == 30
    assert not check_dataset(root).failures


@pytest.mark.slow
def test_a_writer_no_clock_paces_waits_for_its_encoder_and_writes_the_same_bytes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """record --sim's writer (realtime=False) is behind for a second, frozen, with a ring of two
    frames: where a real-time writer spills and cuts (the test above), it waits. Nothing is
    spilled and its mp4 is the in-process encoder's, byte for byte: an offline recording's files
    do not depend on the machine's load (two record --sim workers beside a busy test worker
    once wrote other bytes than one process)."""
    monkeypatch.setenv(RING_ENV, str(2 * FRAME_BYTES))
    rng = np.random.default_rng(7)
    frames = [frame(rng) for _ in range(30)]
    hooks: list[str] = []
    writer = create(tmp_path / "offline", hook=hooks.append, realtime=False)
    pid = writer._workers[CAM].pid
    os.kill(pid, signal.SIGSTOP)
    thaw = threading.Timer(1.0, os.kill, (pid, signal.SIGCONT))
    began = time.monotonic()  # before the timer: the worker is frozen at least 1 s from here
    thaw.start()
    try:
        for f in frames:
            writer.add_frame(f)
            assert writer.spill_bytes == 0
        assert time.monotonic() - began >= 0.9  # it did wait for the frozen worker
        writer.save_episode()
    finally:
        thaw.join()
        os.kill(pid, signal.SIGCONT)
        writer.finalize()
    assert "spill-synced" not in hooks
    monkeypatch.setenv("HILREC_VIDEO_ENCODER", "thread")
    with create(tmp_path / "thread") as reference:
        for f in frames:
            reference.add_frame(f)
        reference.save_episode()
    (offline,) = (tmp_path / "offline" / "videos").rglob("*.mp4")
    (threaded,) = (tmp_path / "thread" / "videos").rglob("*.mp4")
    assert offline.read_bytes() == threaded.read_bytes()


@pytest.mark.slow
def test_an_offline_writer_waits_for_its_in_process_encoder_too(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The thread encoder with a queue of two frames: a burst never ends the take offline."""
    monkeypatch.setenv("HILREC_VIDEO_ENCODER", "thread")
    rng = np.random.default_rng(8)
    with create(tmp_path / "ds", max_video_queue_bytes=2 * FRAME_BYTES, realtime=False) as writer:
        for _ in range(60):
            writer.add_frame(frame(rng))
        writer.save_episode()
    assert read_episode(tmp_path / "ds", 0)["action"].shape == (60, 6)


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


@pytest.mark.slow
def test_finish_spilled_encodes_is_a_no_op_on_a_clean_root(tmp_path: Path) -> None:
    root = tmp_path / "ds"
    rng = np.random.default_rng(4)
    with create(root) as writer:
        for _ in range(5):
            writer.add_frame(frame(rng))
        writer.save_episode()
    assert finish_spilled_encodes(root) == []


@pytest.mark.slow
def test_a_cut_episode_saved_with_its_spill_is_finished_after_a_crash(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The dataset as a SIGKILL would leave it once a cut episode is saved: its mp4 holds the
    frames encoded before the cut, the spill the rest. Reopening joins them: nothing is lost."""
    monkeypatch.setattr(episode_module, "FINISH_WAIT_S", 0.0)
    monkeypatch.setenv(RING_ENV, str(2 * FRAME_BYTES))
    root = tmp_path / "ds"
    rng = np.random.default_rng(6)
    frozen: list[int] = []

    def hook(name: str) -> None:
        if name == "spill-synced":  # the cut is made; freeze the worker before it joins the parts
            os.kill(writer._workers[CAM].pid, signal.SIGSTOP)
            frozen.append(writer._workers[CAM].pid)

    writer = create(root, hook=hook)
    sent = [frame(rng) for _ in range(30)]
    try:
        for f in sent[:12]:
            writer.add_frame(f)
            wait_caught_up(writer)
        with stopped(writer):
            for f in sent[12:]:
                writer.add_frame(f)
        writer.save_episode()
        assert frozen
        snapshot = tmp_path / "crashed"
        shutil.copytree(root, snapshot)
    finally:
        for pid in frozen:
            os.kill(pid, signal.SIGCONT)
        writer.finalize()
    assert pending_spills(snapshot) == [(0, CAM)]
    meta = json.loads((journal.episode_dir(snapshot, 0) / SPILL_META).read_text())
    assert meta["cuts"] == {CAM: 12}
    assert probe_video(journal.episode_dir(snapshot, 0) / f"{CAM}.mp4").frames == 12
    with DatasetWriter.open(snapshot, video_codec="libx264", video_encoder="thread"):
        pass
    assert pending_spills(snapshot) == []
    assert not check_dataset(snapshot).failures
    assert np.array_equal(read_episode(snapshot, 0)["action"], np.stack([f["action"] for f in sent]))
    video = next((snapshot / "videos" / CAM).rglob("*.mp4"))
    with av.open(str(video)) as container:
        assert sum(1 for _ in container.decode(video=0)) == 30


@pytest.mark.slow
def test_a_short_wait_for_the_encoder_shows_no_progress_bar(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    """The bar is for a wait a person notices, not for the milliseconds every finalize of a
    `record --sim --workers` episode waits (there it printed a bar per episode)."""
    monkeypatch.setattr(episode_module, "FINISH_WAIT_S", 0.0)
    monkeypatch.setenv(RING_ENV, str(2 * FRAME_BYTES))
    writer = create(tmp_path / "ds")
    rng = np.random.default_rng(9)
    pid = writer._workers[CAM].pid
    os.kill(pid, signal.SIGSTOP)  # a backlog that cannot drain: the wait runs its whole timeout
    try:
        for _ in range(5):
            writer.add_frame(frame(rng))
        writer.save_episode()
        capfd.readouterr()
        assert writer.wait_videos(0.25, progress=True) is False
        assert "encoding video backlog" not in capfd.readouterr().err
        assert backlog.PROGRESS_AFTER_S > 0.25  # the premise: a shorter wait than a bar is for
    finally:
        os.kill(pid, signal.SIGCONT)
    writer.finalize()
    assert pending_spills(tmp_path / "ds") == []


@pytest.mark.slow
def test_finalize_waits_for_the_backlog_and_resumes_after_an_interrupt(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    """Ctrl-C in finalize's wait for the encoder leaves everything saved; finalize again resumes."""
    monkeypatch.setattr(episode_module, "FINISH_WAIT_S", 0.0)
    monkeypatch.setenv(RING_ENV, str(2 * FRAME_BYTES))
    root = tmp_path / "ds"
    rng = np.random.default_rng(8)
    writer = create(root)
    sent = [frame(rng) for _ in range(25)]
    pid = writer._workers[CAM].pid
    os.kill(pid, signal.SIGSTOP)  # the backlog cannot drain until it is thawed

    def interrupt(_signum: int, _frame: object) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGALRM, interrupt)
    try:
        for f in sent:
            writer.add_frame(f)
        writer.save_episode()  # all 25 frames in the ring or the spill: durable without a cut
        assert writer.video_backlog_s() > 0
        signal.setitimer(signal.ITIMER_REAL, 1.0)
        with pytest.raises(KeyboardInterrupt):
            writer.finalize()
        assert "encoding video backlog" in capfd.readouterr().err  # the progress bar
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        os.kill(pid, signal.SIGCONT)
    writer.finalize()  # resumed
    assert pending_spills(root) == []
    assert not check_dataset(root).failures
    assert np.array_equal(read_episode(root, 0)["action"], np.stack([f["action"] for f in sent]))


START_S = 2.0


@pytest.mark.slow
def test_the_writer_start_waits_while_a_crash_backlog_is_encoded_and_says_so(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The open encodes what a crash left in the spills before it returns; the daemon's start
    gave up on it after its timeout, saying only that the writer did not open."""
    from hilrec.daemon.control.recorder import Recorder

    root = tmp_path / "ds"
    rng = np.random.default_rng(8)
    writer = create(root)
    sent = [frame(rng) for _ in range(25)]
    with stopped(writer):  # nothing encoded: the save goes with its spill, the crash keeps it
        for f in sent:
            writer.add_frame(f)
        writer.save_episode()
        deadline = time.monotonic() + 60
        while not journal.episode_dir(root, 0).is_dir():
            assert time.monotonic() < deadline, "the save was never committed"
            time.sleep(0.01)
        snapshot = tmp_path / "crashed"
        shutil.copytree(root, snapshot)
    writer.finalize()
    assert pending_spills(snapshot) == [(0, CAM)]
    slowed: list[str] = []

    def hook(name: str) -> None:
        if name == "spill-frame" and not slowed:
            slowed.append(name)
            time.sleep(2 * START_S)  # a backlog longer than the start timeout, on any machine

    recorder = Recorder(
        lambda: DatasetWriter.open(snapshot, video_codec="libx264", video_encoder="thread", hook=hook),
        queue_frames=4,
        stall_s=5.0,
    )
    with caplog.at_level("WARNING"):
        recorder.start(timeout_s=START_S)
    try:
        assert slowed
        assert "finishing 1.0 s of video from the spill of episode 0" in caplog.text
        assert pending_spills(snapshot) == []
        recorder.finalize().result(120)
    finally:
        recorder.close(60)
    assert np.array_equal(read_episode(snapshot, 0)["action"], np.stack([f["action"] for f in sent]))


@pytest.mark.slow
def test_the_spill_is_bounded_by_the_free_disk_too(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """spill_bytes_limit alone (16 GiB by default) let the spill fill a smaller disk."""
    import hilrec.daemon.dataset.writer.backlog as backlog_module

    stat = os.statvfs(tmp_path)
    # As if the writer kept the whole disk free: not one frame may spill, whatever other processes
    # free meanwhile (the free space plus a frame was not enough beside a make bench).
    monkeypatch.setattr(backlog_module, "MIN_FREE_BYTES", stat.f_blocks * stat.f_frsize + FRAME_BYTES)
    root = tmp_path / "ds"
    writer = create(root)
    try:
        # The take ends at once (DiskFullError, a take-ending error like SpillFullError): what it
        # recorded fits the room held back for its save.
        with pytest.raises(
            DiskFullError, match=r"disk is nearly full for the video spill.*episode 0 ends at frame 0"
        ):
            writer.add_frame(frame(np.random.default_rng(9)))
    finally:
        writer.close()


def test_the_space_taken_by_an_open_episode_counts_a_sparse_spill_by_its_blocks(tmp_path: Path) -> None:
    from hilrec.daemon.dataset.writer.space import dir_bytes

    with open(tmp_path / "cam.spill", "wb") as f:
        f.truncate(1 << 30)  # frame n written at n*H*W*3: the size says nothing of the disk used
    assert dir_bytes(tmp_path) < 1 << 20


@pytest.mark.slow
def test_finalize_gives_up_on_a_hung_encoder_in_bounded_time_and_the_reopen_finishes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """finalize() waited for the backlog with no bound: a hung encoder process hung it too."""
    import threading

    import hilrec.daemon.dataset.writer.dataset_writer as writer_module

    monkeypatch.setattr(episode_module, "FINISH_WAIT_S", 0.0)
    monkeypatch.setattr(writer_module, "VIDEO_WAIT_S", 1.0)
    root = tmp_path / "ds"
    rng = np.random.default_rng(10)
    writer = create(root)
    sent = [frame(rng) for _ in range(20)]
    pid = writer._workers[CAM].pid
    os.kill(pid, signal.SIGSTOP)  # hung, as far as finalize can tell
    # Resumed later only so that the worker's close ends quickly: the verdict comes before.
    resume = threading.Timer(4.0, os.kill, (pid, signal.SIGCONT))
    try:
        for f in sent:
            writer.add_frame(f)
        writer.save_episode()
        resume.start()
        # Refused, not finished: had finalize waited with no bound, the worker resumed at 4 s
        # would have encoded the episode and finalize would have returned without a word.
        not_encoded = r"episodes \[0\]: their video was not encoded within 1 s"
        with pytest.raises(VideoEncodingError, match=not_encoded):
            writer.finalize()
    finally:
        resume.cancel()
        with contextlib.suppress(ProcessLookupError):  # closed by finalize
            os.kill(pid, signal.SIGCONT)
    with DatasetWriter.open(root, video_codec="libx264", video_encoder="thread"):
        pass
    assert pending_spills(root) == []
    assert np.array_equal(read_episode(root, 0)["action"], np.stack([f["action"] for f in sent]))
