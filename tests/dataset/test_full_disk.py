"""A full disk, for real: a 40 MiB tmpfs is filled during a take, at its commit and at its merge.

What must hold (issue 10, "one bad string or one mistake must never cost a take"): every
acknowledged episode survives; the first take recorded after space is freed is saved; a take whose
commit failed is saved by a retry (or, if the disk never frees, reported lost by name); a take the
disk fills under ends there and is saved with the frames before (issue 23: the writer holds back
the room for its save); a failing merge leaves LeRobot's files as they were and is retried;
``space_problem`` sees the disk fill up before it bites.

A take can no longer fill the disk for its own commit (the room is held back while it records), so
the commit failures are made the way another process would: the disk is filled at the save, after
the room held back is given back (the writer's ``videos-finished`` hook).

The tests run as root (the machine's test runner is root), so they mount a tmpfs. Where mounting
is refused, they fall back to ``RLIMIT_FSIZE``, which fails writes with EFBIG instead of ENOSPC:
the same paths, minus what only a real file system shows (free space, the ENOSPC wording).
"""

from __future__ import annotations

import contextlib
import json
import os
import resource
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from hilrec.daemon.dataset.format.reader import load_episodes, read_episode
from hilrec.daemon.dataset.format.sidecar import load_episode_sidecar
from hilrec.daemon.dataset.video.codec import probe_video
from hilrec.daemon.dataset.writer.dataset_writer import MIN_FREE_BYTES, DatasetWriter
from hilrec.daemon.dataset.writer.reserve import FIXED_BYTES, LOW_WATER_BYTES
from hilrec.daemon.errors import DatasetError, DiskFullError
from hilrec.daemon.so101 import ACTION_KEY, so101_features

# Real tmpfs mounts filled in child processes: the slow tier (make test runs it; make test-fast does not).
pytestmark = pytest.mark.slow

FPS = 25
H, W = 96, 128
CAM = "observation.images.front"
SIZE = "40m"


class Disk:
    """A small file system at ``path`` that the test fills and frees."""

    def __init__(self, path: Path, kind: str) -> None:
        self.path = path
        self.kind = kind  # "tmpfs", or "rlimit" (the fallback: a per-file size limit)
        self._filler = path / "filler.bin"
        self._soft, self._hard = resource.getrlimit(resource.RLIMIT_FSIZE)
        self.fill_at_save = False  # the writer's hook fills the disk at each save while set

    def hook(self, name: str) -> None:
        if name == "videos-finished" and self.fill_at_save:
            self.fill()

    @property
    def free(self) -> int:
        stat = os.statvfs(self.path)
        return stat.f_bavail * stat.f_frsize

    def fill(self, leave: int = 0) -> None:
        """Leave ``leave`` bytes free (rlimit: no file may grow past ``leave``)."""
        if self.kind == "rlimit":
            resource.setrlimit(resource.RLIMIT_FSIZE, (max(leave, 1), self._hard))
            return
        with open(self._filler, "ab") as out:
            while (gap := self.free - leave) > 0:
                try:
                    out.write(b"\0" * min(gap, 4 * 1024 * 1024))
                    out.flush()
                except OSError:
                    break

    def free_up(self) -> None:
        if self.kind == "rlimit":
            resource.setrlimit(resource.RLIMIT_FSIZE, (self._soft, self._hard))
            return
        self._filler.unlink(missing_ok=True)


@pytest.fixture()
def disk(tmp_path: Path) -> Iterator[Disk]:
    path = tmp_path / "disk"
    path.mkdir()
    mount = ["mount", "-t", "tmpfs", "-o", f"size={SIZE}", "tmpfs", str(path)]
    mounted = os.geteuid() == 0 and subprocess.run(mount, check=False, capture_output=True).returncode == 0
    previous = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    fs = Disk(path, "tmpfs" if mounted else "rlimit")
    try:
        yield fs
    finally:
        fs.free_up()
        signal.signal(signal.SIGXFSZ, previous)
        if mounted and subprocess.run(["umount", str(path)], check=False, capture_output=True).returncode:
            subprocess.run(["umount", "-l", str(path)], check=True)


def frames_of(take: int, n: int, *, camera: bool) -> list[dict[str, Any]]:
    rng = np.random.default_rng(100 + take)
    frames = []
    for _ in range(n):
        frame: dict[str, Any] = {
            "action": rng.normal(size=6).astype(np.float32),
            "observation.state": rng.normal(size=6).astype(np.float32),
            "task": f"take {take}",
        }
        if camera:
            frame[CAM] = rng.integers(0, 255, (H, W, 3), dtype=np.uint8)  # noise: big, known size
        frames.append(frame)
    return frames


def record(writer: DatasetWriter, frames: list[dict[str, Any]]) -> str | None:
    """Record one take as the daemon's writer thread does: a refused frame marks the take broken,
    and its stop discards it. Returns why it was discarded (None: the frames all went in)."""
    for frame in frames:
        try:
            writer.add_frame(frame)
        except (DatasetError, OSError) as exc:
            writer.discard_episode()
            return str(exc)
    return None


def create(disk: Disk, *, camera: bool) -> DatasetWriter:
    return DatasetWriter.create(
        disk.path / "ds",
        fps=FPS,
        features=so101_features({"front": (H, W)} if camera else {}),
        robot_type=None,
        video_codec="libx264",
        hook=disk.hook,
    )


def assert_holds(root: Path, takes: dict[int, int], lengths: dict[int, int], *, camera: bool) -> None:
    """LeRobot's files hold exactly ``takes`` (episode_index -> take), bit-equal, whole."""
    rows = load_episodes(root)
    assert [r["episode_index"] for r in rows] == sorted(takes)
    info = json.loads((root / "meta/info.json").read_text())
    assert info["total_episodes"] == len(takes)
    for index, take in takes.items():
        expected = frames_of(take, lengths[take], camera=camera)
        actions = read_episode(root, index, [ACTION_KEY])[ACTION_KEY]
        assert np.array_equal(actions, np.stack([f["action"] for f in expected])), f"episode {index}"
        assert rows[index]["tasks"] == [f"take {take}"]
        sidecar, _ = load_episode_sidecar(root, index)
        assert sidecar is not None and sidecar["take"] == take
    if camera:
        video = root / f"videos/{CAM}/chunk-000/file-000.mp4"
        assert probe_video(video).frames == info["total_frames"]
    assert not list(root.rglob("*.hilrec-new")) and not list(root.rglob(".episode-*.tmp"))


def test_a_full_disk_at_the_commit_costs_no_take(disk: Disk) -> None:
    """Fill the disk at a save, record, free it, record again: the take after freeing is saved,
    and so is the one that failed while the disk was full (in order, with the number it was
    given); a take started on the full disk is refused at its first frame."""
    lengths = {0: 40, 1: 3000, 2: 500, 3: 60}
    writer = create(disk, camera=False)
    root = writer.root
    try:
        assert record(writer, frames_of(0, lengths[0], camera=False)) is None
        assert writer.save_episode(sidecar={"take": 0}) == 0
        writer.wait_consolidated(timeout=60)
        assert writer.space_problem(need_bytes=1024 * 1024) is None
        # Take 1: the frames went in, the disk fills at its save, which fails.
        assert record(writer, frames_of(1, lengths[1], camera=False)) is None
        disk.fill_at_save = True
        with pytest.raises(DatasetError, match=r"saving episode 1 failed .* kept with its 3000 frames"):
            writer.save_episode(sidecar={"take": 1})
        disk.fill_at_save = False
        assert writer.failed_saves == [1] and not writer.episode_open
        if disk.kind == "tmpfs":
            problem = writer.space_problem(need_bytes=1024 * 1024)
            assert problem is not None and "(1048576 bytes" in problem and f"({disk.free} bytes)" in problem
            # Take 2, disk still full: refused at its first frame, the disk named; nothing lost.
            why = record(writer, frames_of(2, lengths[2], camera=False))
            assert why is not None and "the disk is full" in why and "ends at frame 0" in why
        assert [p.split(": ")[1][:9] for p in writer.problems()] == ["episode 1"]
        disk.free_up()
        # Take 3, after freeing: saved, after the one before it.
        assert record(writer, frames_of(3, lengths[3], camera=False)) is None
        assert writer.save_episode(sidecar={"take": 3}) == 2
        assert writer.failed_saves == [] and writer.num_episodes == 3
        writer.wait_consolidated(timeout=60)
        assert writer.problems() == []
    finally:
        writer.close()
    assert_holds(root, {0: 0, 1: 1, 2: 3}, lengths, camera=False)


def test_a_failed_save_is_retried_on_its_own_once_space_returns(disk: Disk) -> None:
    lengths = {0: 30, 1: 2000}
    writer = create(disk, camera=False)
    root = writer.root
    try:
        assert record(writer, frames_of(0, lengths[0], camera=False)) is None
        writer.save_episode(sidecar={"take": 0})
        assert record(writer, frames_of(1, lengths[1], camera=False)) is None
        disk.fill_at_save = True
        with pytest.raises(DatasetError, match="kept with its 2000 frames"):
            writer.save_episode(sidecar={"take": 1})
        disk.fill_at_save = False
        disk.free_up()
        # No save, no retry_failed(): the commit thread retries every few seconds once it fits.
        deadline = time.monotonic() + 30
        tick = threading.Event()  # never set: a bounded wait between looks at the condition
        while writer.failed_saves and time.monotonic() < deadline:
            tick.wait(0.05)
        assert writer.failed_saves == [], "the held save was not retried within 30 s"
        writer.wait_consolidated(timeout=60)
    finally:
        writer.close()
    assert_holds(root, {0: 0, 1: 1}, lengths, camera=False)


def test_a_disk_that_never_frees_reports_the_lost_take_by_name(disk: Disk) -> None:
    lengths = {0: 30, 1: 2000, 2: 20}
    writer = create(disk, camera=False)
    root = writer.root
    assert record(writer, frames_of(0, lengths[0], camera=False)) is None
    writer.save_episode(sidecar={"take": 0})
    writer.wait_consolidated(timeout=60)
    assert record(writer, frames_of(1, lengths[1], camera=False)) is None
    disk.fill_at_save = True
    with pytest.raises(DatasetError, match="kept"):
        writer.save_episode(sidecar={"take": 1})
    disk.fill_at_save = False
    with pytest.raises(DatasetError, match=r"episode\(s\) 1 \(2000 frames\) could not be saved .* lost"):
        writer.finalize()
    disk.free_up()
    assert_holds(root, {0: 0}, lengths, camera=False)
    assert load_episode_sidecar(root, 1) == (None, {})
    with DatasetWriter.open(root, video_codec="libx264") as reopened:  # the lock was released
        assert record(reopened, frames_of(2, lengths[2], camera=False)) is None
        assert reopened.save_episode(sidecar={"take": 2}) == 1
    assert_holds(root, {0: 0, 1: 2}, lengths, camera=False)


def test_a_full_disk_during_a_take_ends_it_there_and_keeps_it(disk: Disk) -> None:
    """With a camera the take streams to disk: when the disk fills, the take ends at that frame
    (DiskFullError, naming it) and its save keeps every frame before, in the room held back for
    it. The next one, after freeing, is saved."""
    lengths = {0: 25, 1: 400, 2: 30}
    writer = create(disk, camera=True)
    root = writer.root
    try:
        assert record(writer, frames_of(0, lengths[0], camera=True)) is None
        assert writer.save_episode(sidecar={"take": 0}) == 0
        writer.wait_consolidated(timeout=60)
        if disk.kind != "tmpfs":
            pytest.skip("a file size limit is not a full disk: no free space to watch")
        take = frames_of(1, lengths[1], camera=True)
        for frame in take[:100]:
            writer.add_frame(frame)
        # Filled to a few frames' worth: a disk filled to the last byte at once, by another
        # process, between two frames, still fails the thread encoder's next write (see the
        # writer's reserve module).
        disk.fill(leave=256 * 1024)
        assert writer.space_problem() is not None  # what the daemon asks before a take
        ended = None
        for frame in take[100:]:
            try:
                writer.add_frame(frame)
            except DiskFullError as exc:
                ended = exc
                break
        assert ended is not None, "the take went on past a full disk"
        kept = writer._episode.length if writer._episode is not None else 0
        assert kept >= 100 and f"ends at frame {kept}" in str(ended) and "episode 1" in str(ended)
        assert writer.save_episode(sidecar={"take": 1}) == 1  # durable, the disk still full
        lengths[1] = kept
        disk.free_up()
        assert record(writer, frames_of(2, lengths[2], camera=True)) is None
        assert writer.save_episode(sidecar={"take": 2}) == 2
        writer.wait_consolidated(timeout=60)
    finally:
        writer.close()
    assert_holds(root, {0: 0, 1: 1, 2: 2}, lengths, camera=True)


def test_a_full_disk_at_the_merge_keeps_lerobot_files_and_is_retried(disk: Disk) -> None:
    """Room for the take and its commit, not for the merge's new copy of the video file: the
    take is saved, the merge fails and is reported by episode, LeRobot's files stay whole (the
    take before is still there), and the merge succeeds on its own once space is freed."""
    lengths = {0: 4500, 1: 20, 2: 20}
    writer = create(disk, camera=True)
    root = writer.root
    try:
        assert record(writer, frames_of(0, lengths[0], camera=True)) is None
        writer.save_episode(sidecar={"take": 0})
        writer.wait_consolidated(timeout=60)
        video = root / f"videos/{CAM}/chunk-000/file-000.mp4"
        per_frame = video.stat().st_size / lengths[0]
        # The take's video twice, and the room the writer holds back while it records (its save's
        # reserve, above the free space its encoder may still use).
        held = FIXED_BYTES + LOW_WATER_BYTES + FPS * H * W * 3
        leave = held + int(per_frame * lengths[1] * 2) + 512 * 1024
        assert video.stat().st_size > 2 * leave  # the merge's copy cannot fit
        disk.fill(leave=leave)
        assert record(writer, frames_of(1, lengths[1], camera=True)) is None
        assert writer.save_episode(sidecar={"take": 1}) == 1  # durable: in the journal
        with pytest.raises(
            DatasetError, match=r"merging saved episodes \[1\] into LeRobot's files"
        ) as failed:
            writer.wait_consolidated(timeout=60)
        if disk.kind == "tmpfs":
            assert "No space left on device" in str(failed.value)
        (problem,) = writer.problems()
        assert "merging saved episodes [1]" in problem and "hold episodes 0..0, unchanged" in problem
        assert_holds(root, {0: 0}, lengths, camera=True)  # as before the failed merge
        assert (root / "hilrec/journal/episode-000001/episode.json").is_file()
        disk.free_up()
        writer.wait_consolidated(timeout=90, retry=False)  # the merger's own retry
        assert writer.problems() == []
        assert record(writer, frames_of(2, lengths[2], camera=True)) is None
        assert writer.save_episode(sidecar={"take": 2}) == 2
        writer.wait_consolidated(timeout=60)
    finally:
        with contextlib.suppress(DatasetError):
            writer.close()
    assert_holds(root, {0: 0, 1: 1, 2: 2}, lengths, camera=True)


def test_space_problem_names_what_is_needed_and_what_is_free(disk: Disk) -> None:
    writer = create(disk, camera=True)
    try:
        if disk.kind == "tmpfs":
            problem = writer.space_problem()  # a 40 MiB disk is below the 64 MiB floor
            assert problem is not None
            assert f"({MIN_FREE_BYTES} bytes" in problem and f"({disk.free} bytes)" in problem
            assert "frames x" in problem
        assert writer.space_problem(need_bytes=1024) is None
        assert writer.space_needed() >= MIN_FREE_BYTES
        for frame in frames_of(0, 300, camera=True):
            writer.add_frame(frame)
        writer.save_episode(sidecar={"take": 0})
        writer.wait_consolidated(timeout=60)
        # Sized from what was measured: 300 frames of noise, twice, plus the merge's copy.
        video = writer.root / f"videos/{CAM}/chunk-000/file-000.mp4"
        assert writer.space_needed() >= max(MIN_FREE_BYTES, 2 * video.stat().st_size)
    finally:
        writer.close()
