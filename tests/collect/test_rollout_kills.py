"""``hilrec rollout`` attacked: the policy's process killed mid-take (a ``policy`` fault: the take
is saved, the session says why and finishes cleanly), and the session itself killed by SIGKILL
(its daemon is told by the kernel, saves and finalizes: no take it reported saved is lost)."""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from _daemon import Daemon, check_passes, emulated_config, run_cli

from hilrec.daemon.dataset.format.reader import load_episodes, load_info
from hilrec.daemon.dataset.format.sidecar import load_episode_sidecar
from hilrec.daemon.errors import DaemonUnreachableError
from hilrec.daemon.wire.client import ControlClient

pytestmark = pytest.mark.slow

POLICIES = Path(__file__).resolve().parents[1] / "policy" / "_policies.py"
EXIT_TIMEOUT_S = 240.0


class Session:
    """A headless ``hilrec rollout``, its stdout read line by line on a thread."""

    def __init__(self, config: Path, *flags: str) -> None:
        argv = [
            sys.executable, "-m", "hilrec.daemon.cli", "rollout", "--config", str(config),
            "--policy", f"{POLICIES}:hold_still", "--no-sounds", *flags,
        ]  # fmt: skip
        self.process = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        self.lines: queue.Queue[str] = queue.Queue()
        self.seen: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.put(line)

    def wait_line(self, text: str, timeout_s: float) -> str:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                line = self.lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise AssertionError(
                    f"{text!r} not printed in {timeout_s} s:\n{''.join(self.seen)}"
                ) from None
            self.seen.append(line)
            if text in line:
                return line

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait(30)


def wait_frames(client: ControlClient, frames: int, timeout_s: float = 120.0) -> dict:
    deadline = time.monotonic() + timeout_s
    while True:
        status = client.call("status")
        if int((status.get("episode") or {}).get("frames") or 0) >= frames:
            return status
        assert time.monotonic() < deadline, f"no episode reached {frames} frames"
        time.sleep(0.05)  # between bounded status requests


def test_a_policy_killed_mid_take_is_a_fault_and_the_take_is_saved(tmp_path: Path) -> None:
    root = tmp_path / "ds"
    daemon = Daemon(tmp_path, emulated_config(root))
    session = Session(
        daemon.config_path, "--episodes", "1", "--episode-time-s", "120", "--reset-time-s", "0.5"
    )
    client = ControlClient(daemon.control, timeout_ms=3000, retries=5)
    try:
        session.wait_line("take 1 of 1: recording episode 0", 180)
        status = wait_frames(client, 30)
        pid = int(status["devices"]["policy"]["pid"])
        os.kill(pid, signal.SIGKILL)
        fault = session.wait_line("FAULT policy", 60)
        assert str(pid) in fault
        session.wait_line("take 1: episode 0 ended by the daemon (fault:policy", 60)
        verdict = session.wait_line("verdict take 1 (episode 0)", 180)
        assert "ended by a fault (policy" in verdict
        assert session.process.wait(EXIT_TIMEOUT_S) == 0, "".join(session.seen)
    finally:
        client.close()
        session.close()
    meta, _ = load_episode_sidecar(root, 0)
    assert meta is not None and str(meta["ended_by"]).startswith("fault:policy")
    assert meta["rollout"]["frames"] == meta["frames"] >= 30
    check_passes(root)


def test_sigkill_of_the_session_loses_no_saved_take(tmp_path: Path) -> None:
    root = tmp_path / "ds"
    daemon = Daemon(tmp_path, emulated_config(root))
    session = Session(daemon.config_path, "--episodes", "3", "--episode-time-s", "2", "--reset-time-s", "0.5")
    client = ControlClient(daemon.control, timeout_ms=3000, retries=5)
    try:
        saved = session.wait_line("take 1 saved: episode 0", 240)
        frames = int(saved.split(", ")[1].split()[0])
        wait_frames(client, 10)  # take 2 under way: the daemon holds an open take
        session.process.send_signal(signal.SIGKILL)
        session.process.wait(30)
        # The daemon got SIGTERM from the kernel (collect's machinery asks for it): it saves the
        # open take, finalizes and exits; its control port then stops answering.
        deadline = time.monotonic() + EXIT_TIMEOUT_S
        while True:
            try:
                client.call("status")
            except DaemonUnreachableError:
                break
            assert time.monotonic() < deadline, "the daemon outlived its session"
            time.sleep(0.2)  # between bounded status requests
    finally:
        client.close()
        session.close()
    repaired = run_cli("repair", str(root))
    assert "Traceback" not in repaired.stderr, repaired.stderr
    episodes = load_episodes(root)
    assert episodes and int(episodes[0]["length"]) == frames
    check_passes(root)


def test_a_policy_killed_between_correction_windows_is_said_and_ends_the_session(tmp_path: Path) -> None:
    root = tmp_path / "ds"
    daemon = Daemon(tmp_path, emulated_config(root))
    session = Session(
        daemon.config_path, "--episodes", "2", "--episode-time-s", "120", "--reset-time-s", "0.5",
        "--record", "corrections",
    )  # fmt: skip
    client = ControlClient(daemon.control, timeout_ms=3000, retries=5)
    try:
        session.wait_line("take 1 of 2: the policy drives; corrections are recorded", 180)
        pid = int(client.call("status")["devices"]["policy"]["pid"])
        os.kill(pid, signal.SIGKILL)
        assert str(pid) in session.wait_line("FAULT policy", 30)  # while the take still runs
        session.wait_line("the policy is gone (its fault above): the session ends", 30)
        session.wait_line("rollout: 0 take(s) kept", 120)
        assert session.process.wait(EXIT_TIMEOUT_S) == 0, "".join(session.seen)
    finally:
        client.close()
        session.close()
    # Nothing was corrected: nothing recorded.
    assert not (root / "meta" / "info.json").exists() or load_info(root)["total_episodes"] == 0
