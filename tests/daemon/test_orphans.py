"""A daemon killed with SIGKILL takes its emulated arms with it, every time, and the next one
sweeps the folder of calibrations the killed one left.

The emulators are child processes that get SIGTERM when the daemon dies (hilrec.daemon.procs). An
emulator that handled SIGTERM with a Python handler setting an Event deadlocked whenever the
signal landed while its main thread was inside that Event's wait (7 orphans in 42 kills), so
this kills 20 daemons at varied moments and counts the emulators still alive afterwards.
"""

from __future__ import annotations

import os
import random
import signal
import time
from pathlib import Path

import pytest
from _daemon import Daemon, emulated_config

from hilrec.daemon.control.hardware import EMULATED_SCRATCH_PREFIX

KILLS = 20
EXIT_TIMEOUT_S = 10.0


def alive(pid: int) -> bool:
    """Running, not a zombie waiting for a reaper (which counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            state = stat.read().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state not in ("Z", "X")


@pytest.mark.slow
def test_twenty_sigkilled_daemons_leave_no_emulator_running(tmp_path: Path) -> None:
    rng = random.Random(7)
    orphans: list[tuple[int, int]] = []
    scratch_left: list[int] = []
    for trial in range(KILLS):
        daemon = Daemon(tmp_path, emulated_config(tmp_path / f"ds{trial}")).start()
        scratch_left.append(len(list(daemon.temp_dir.glob(f"{EMULATED_SCRATCH_PREFIX}*"))))
        assert daemon.process is not None
        devices = daemon.call("status")["devices"]
        pids = [int(devices[role]["emulator_pid"]) for role in ("follower", "leader")]
        if trial % 2:
            daemon.call("start_episode", task="killed mid-take")
            daemon.wait_frames(rng.randrange(1, 15))
        for _ in range(rng.randrange(0, 20)):  # land the kill at a varied moment of the emulators' loop
            daemon.call("status")
        os.kill(daemon.process.pid, signal.SIGKILL)
        daemon.process.wait(10)
        deadline = time.monotonic() + EXIT_TIMEOUT_S
        while any(alive(pid) for pid in pids) and time.monotonic() < deadline:
            time.sleep(0.05)  # polling a condition (process exit) with a deadline
        for pid in pids:
            if alive(pid):
                orphans.append((trial, pid))
                os.kill(pid, signal.SIGKILL)
        daemon.close()
    assert scratch_left == [1] * KILLS, "a started daemon's own folder, and none of a killed one's"
    assert orphans == [], f"emulators still running {EXIT_TIMEOUT_S} s after their daemon died: {orphans}"
