"""The daemon on a full disk, for real: a small tmpfs under the dataset, filled before and during a take.

What must hold (issue 23, item 5): a start is refused while the disk cannot hold a take, naming
what is free and what a take needs; a take running when the disk fills ends there with a
``disk_full`` fault that says so, and is saved (acknowledged, durable) with the frames before it,
whichever encoder the video goes through. The tests run as root (the test runner is), so they
mount a tmpfs; where mounting is refused they are skipped.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from _daemon import Daemon, check_passes, sim_config

from hilrec.daemon.dataset.format.reader import load_episodes
from hilrec.daemon.dataset.format.sidecar import load_episode_sidecar

# Real daemons, processes or kill loops: the slow tier (make test runs it; make test-fast does not).
pytestmark = pytest.mark.slow

# Above the writer's 64 MiB floor with room for a few takes of 48x64 video.
SIZE_MB = 96


class Disk:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.filler = path / "filler.bin"

    @property
    def free(self) -> int:
        stat = os.statvfs(self.path)
        return stat.f_bavail * stat.f_frsize

    def fill(self, leave: int) -> None:
        """Leave about ``leave`` bytes free (the daemon may be writing meanwhile)."""
        with open(self.filler, "ab") as out:
            while (gap := self.free - leave) > 0:
                try:
                    out.write(b"\0" * min(gap, 4 * 1024 * 1024))
                    out.flush()
                except OSError:
                    break

    def free_up(self) -> None:
        self.filler.unlink(missing_ok=True)


@pytest.fixture()
def disk(tmp_path: Path) -> Iterator[Disk]:
    path = tmp_path / "disk"
    path.mkdir()
    mount = ["mount", "-t", "tmpfs", "-o", f"size={SIZE_MB}m", "tmpfs", str(path)]
    if os.geteuid() != 0 or subprocess.run(mount, check=False, capture_output=True).returncode != 0:
        pytest.skip("needs a tmpfs mount (root)")
    try:
        yield Disk(path)
    finally:
        if subprocess.run(["umount", str(path)], check=False, capture_output=True).returncode:
            subprocess.run(["umount", "-l", str(path)], check=True)


def start_daemon(tmp_path: Path, disk: Disk, encoder: str) -> Daemon:
    dataset = (
        f'video_encoder = "{encoder}"\nvideo_codec = "libx264"'
        if encoder == "thread"
        else (f'video_encoder = "{encoder}"')
    )
    return Daemon(tmp_path, sim_config(disk.path / "ds", dataset_extra=dataset)).start()


@pytest.mark.parametrize("encoder", ["process", "thread"])
def test_a_start_is_refused_while_the_disk_cannot_hold_a_take(
    tmp_path: Path, disk: Disk, encoder: str
) -> None:
    daemon = start_daemon(tmp_path, disk, encoder)
    try:
        disk.fill(leave=4 * 1024 * 1024)
        refused = daemon.request("start_episode", task="pick the cube", seed=1)
        assert not refused["ok"], refused
        assert refused["code"] == "fault"
        assert "free" in refused["error"] and "needs" in refused["error"], refused["error"]
        assert daemon.call("status")["state"] == "idle"
        disk.free_up()
        daemon.call("start_episode", task="pick the cube", seed=1)
        daemon.wait_frames(5)
        daemon.call("stop_episode", success=True)
        daemon.wait_saved(1)
        assert daemon.shutdown() == 0
    finally:
        daemon.close()
    assert load_episodes(disk.path / "ds")[0]["length"] >= 5


@pytest.mark.parametrize("encoder", ["process", "thread"])
def test_a_take_the_disk_fills_under_ends_there_and_is_saved(
    tmp_path: Path, disk: Disk, encoder: str
) -> None:
    daemon = start_daemon(tmp_path, disk, encoder)
    try:
        daemon.call("start_episode", task="pick the cube", seed=1)
        before = daemon.wait_frames(20)["episode"]["frames"]
        disk.fill(leave=256 * 1024)
        status = daemon.wait_status(
            # The fault and the idle state come at the tick that ends the take; last_episode when
            # the writer thread has taken its save, a moment later.
            lambda s: (
                s["state"] == "idle"
                and any(f["kind"] == "disk_full" for f in s["faults"])
                and s["last_episode"] is not None
            ),
            timeout_s=60,
            what="the take ended by a disk_full fault",
        )
        fault = next(f for f in status["faults"] if f["kind"] == "disk_full")
        assert "saves it" in fault["message"] and "free" in fault["message"], fault
        assert status["last_episode"]["ended_by"] == "fault:disk_full:writer"
        saved = daemon.wait_status(
            lambda s: s["dataset"]["saving"] == 0, timeout_s=60, what="the save answered"
        )
        # Acknowledged while the disk is still full: durable in the journal.
        assert saved["last_episode"].get("saved") is True, saved["last_episode"]
        assert saved["dataset"]["saved_this_session"] == 1
        refused = daemon.request("start_episode", task="again")
        assert not refused["ok"] and refused["code"] == "fault"
        disk.free_up()
        assert daemon.shutdown() == 0
    finally:
        daemon.close()
    root = disk.path / "ds"
    check_passes(root)
    (episode,) = load_episodes(root)
    assert episode["length"] >= before
    sidecar, _arrays = load_episode_sidecar(root, 0)
    assert sidecar is not None and sidecar["ended_by"] == "fault:disk_full:writer"
    assert sidecar["frames"] == episode["length"]
