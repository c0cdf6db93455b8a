"""A scratch folder (daemon/scratch.py): a SIGKILLed owner's folder is swept by the next one made,
a live owner's is not, and a folder swept before its owner locked it is replaced."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from hilrec.daemon import scratch
from hilrec.daemon.scratch import scratch_folder, sweep

PREFIX = "hilrec-test-scratch-"
BOUND_S = 30.0

OWNER = f"""
import contextlib, sys, time
from hilrec.daemon.scratch import scratch_folder
stack = contextlib.ExitStack()
path = scratch_folder(stack, {PREFIX!r})
(path / "calibration.json").write_text("{{}}")
print(path, flush=True)
time.sleep(600)
"""


@pytest.fixture
def tmp_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    return tmp_path


def _owner() -> tuple[subprocess.Popen[str], Path]:
    process = subprocess.Popen([sys.executable, "-c", OWNER], stdout=subprocess.PIPE, text=True)
    assert process.stdout is not None
    return process, Path(process.stdout.readline().strip())


def test_a_killed_owners_folder_is_swept_and_a_live_owners_kept(tmp_dir: Path) -> None:
    killed, killed_path = _owner()
    alive, alive_path = _owner()
    try:
        killed.send_signal(signal.SIGKILL)
        killed.wait(BOUND_S)
        assert (killed_path / "calibration.json").is_file()  # nothing ran its cleanup
        with contextlib.ExitStack() as stack:
            mine = scratch_folder(stack, PREFIX)
            assert not killed_path.exists()
            assert (alive_path / "calibration.json").is_file()
            assert mine.is_dir() and mine.parent == tmp_dir and mine.name.startswith(PREFIX)
            # Held by this process now: another sweep leaves it.
            assert sweep(PREFIX) == []
        assert not mine.exists()
    finally:
        alive.kill()
        alive.wait(BOUND_S)
    assert sweep(PREFIX) == [alive_path.name]


def test_a_sweep_leaves_what_is_not_a_folder_of_its_own(tmp_dir: Path) -> None:
    target = tmp_dir / "elsewhere"
    target.mkdir()
    (target / "keep").write_text("x")
    (tmp_dir / f"{PREFIX}link").symlink_to(target)
    (tmp_dir / f"{PREFIX}file").write_text("x")
    (tmp_dir / "hilrec-other-1").mkdir()
    assert sweep(PREFIX) == []
    assert (target / "keep").is_file()
    assert (tmp_dir / f"{PREFIX}file").is_file()
    assert (tmp_dir / "hilrec-other-1").is_dir()


def test_a_folder_swept_before_its_owner_locked_it_is_replaced(
    tmp_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    made: list[Path] = []
    real_mkdtemp, real_flock = tempfile.mkdtemp, scratch.fcntl.flock

    def mkdtemp(prefix: str) -> str:
        path = real_mkdtemp(prefix=prefix)
        made.append(Path(path))
        if len(made) == 1:
            os.rmdir(path)  # swept before it was opened
        return path

    def flock(fd: int, operation: int) -> None:
        if len(made) == 2 and made[1].exists():
            os.rmdir(made[1])  # swept after it was opened, before it was locked
        real_flock(fd, operation)

    monkeypatch.setattr(scratch.tempfile, "mkdtemp", mkdtemp)
    monkeypatch.setattr(scratch.fcntl, "flock", flock)
    with contextlib.ExitStack() as stack:
        path = scratch_folder(stack, PREFIX)
        assert path == made[2] and path.is_dir()
    assert len(made) == 3 and not any(p.exists() for p in made)


def test_a_folder_someone_else_holds_is_left_to_them_and_another_made(
    tmp_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A sweeper that forked while it held a folder's lock leaves its child holding it: the owner
    must not wait for that child, it makes another folder."""
    calls: list[int] = []
    real_flock = scratch.fcntl.flock

    def flock(fd: int, operation: int) -> None:
        calls.append(operation)
        if len(calls) == 1:
            raise BlockingIOError(11, "Resource temporarily unavailable")
        real_flock(fd, operation)

    monkeypatch.setattr(scratch, "sweep", lambda prefix: [])
    monkeypatch.setattr(scratch.fcntl, "flock", flock)
    with contextlib.ExitStack() as stack:
        path = scratch_folder(stack, PREFIX)
        assert len(calls) == 2 and all(op & scratch.fcntl.LOCK_NB for op in calls)
        assert len(list(tmp_dir.glob(f"{PREFIX}*"))) == 2  # the held one is the holder's to end
    assert not path.exists()


def test_where_flock_is_refused_the_folder_is_kept_unlocked(
    tmp_dir: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def flock(fd: int, operation: int) -> None:
        raise OSError(9, "Bad file descriptor")  # NFS clients refuse an exclusive lock so

    monkeypatch.setattr(scratch.fcntl, "flock", flock)
    with contextlib.ExitStack() as stack:
        path = scratch_folder(stack, PREFIX)
        assert path.is_dir()
        assert sweep(PREFIX) == []  # a sweep there cannot tell it from a dead owner's: kept
    assert not path.exists()
    assert "cannot be locked" in caplog.text
