"""One writer per root: the lock names its holder, and a SIGKILLed holder frees it."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest

from hilrec.daemon.dataset.store.rootlock import RootLock
from hilrec.daemon.errors import DatasetLockedError, DatasetStateError

HOLDER = """
import sys
from hilrec.daemon.dataset.store.rootlock import RootLock
lock = RootLock(sys.argv[1], "hilrec daemon (test holder)").acquire()
print("held", flush=True)
sys.stdin.read()
"""


def hold(root: Path) -> subprocess.Popen[str]:
    child = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(root)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert child.stdout is not None and child.stdout.readline().strip() == "held"
    return child


def test_a_second_writer_is_refused_with_the_holders_pid_and_command(tmp_path: Path) -> None:
    root = tmp_path / "ds"
    child = hold(root)
    try:
        with pytest.raises(DatasetLockedError) as refused:
            RootLock(root, "hilrec repair").acquire()
        assert f"pid {child.pid}" in str(refused.value)
        assert "hilrec daemon (test holder)" in str(refused.value) and str(root) in str(refused.value)
    finally:
        child.kill()
        child.wait(timeout=10)


def test_a_killed_holder_leaves_the_root_free(tmp_path: Path) -> None:
    root = tmp_path / "ds"
    child = hold(root)
    child.send_signal(signal.SIGKILL)
    child.wait(timeout=10)
    with RootLock(root, "hilrec repair") as lock:
        assert lock.held
    with RootLock(root, "again"):  # released on exit
        pass


def test_one_process_cannot_take_the_lock_twice_through_two_writers(tmp_path: Path) -> None:
    with RootLock(tmp_path / "ds", "first"), pytest.raises(DatasetLockedError, match="first"):
        RootLock(tmp_path / "ds", "second").acquire()


@pytest.mark.parametrize("where", ["file", "proc"])
def test_a_root_that_cannot_be_a_folder_is_a_clear_error(tmp_path: Path, where: str) -> None:
    if where == "file":
        root = tmp_path / "plain-file"
        root.write_text("not a dataset")
    else:
        root = Path("/proc/self/hilrec-root")
    with pytest.raises(DatasetStateError, match=str(root)) as refused:
        RootLock(root, "hilrec daemon").acquire()
    assert "Traceback" not in str(refused.value)


def test_a_root_holding_only_a_leftover_lock_file_is_recorded_into_without_resume(tmp_path: Path) -> None:
    from hilrec.daemon.dataset.store.rootlock import LOCK_NAME, holds_nothing
    from hilrec.sim.recorder import RecordConfig, record

    root = tmp_path / "ds"
    root.mkdir()
    (root / LOCK_NAME).write_text('{"pid": 1, "command": "a writer that never wrote"}\n')
    assert holds_nothing(root) and holds_nothing(tmp_path / "missing")
    summary = record(RecordConfig(root=root, episodes=1, cameras=()), progress=False)
    assert summary.frames > 0
    assert not holds_nothing(root)
