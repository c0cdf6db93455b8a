"""``hilrec collect`` end to end: a real daemon (emulated arms, a small twin camera) started by
collect, keys typed into collect's own terminal (a pty), the dataset checked afterwards."""

from __future__ import annotations

import json
import os
import re
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from _daemon import Daemon, check_passes, emulated_config, run_cli, sim_config
from _terminal import Terminal

from hilrec.daemon.dataset.format.reader import load_episodes
from hilrec.daemon.dataset.format.sidecar import load_episode_sidecar
from hilrec.daemon.wire.client import ControlClient

# Real daemons, processes or kill loops: the slow tier (make test runs it; make test-fast does not).
pytestmark = pytest.mark.slow

FPS = 25
TAKE_S = 4.0
CAMERA = """
[cameras.front]
source = "twin"
height = 48
width = 64
fps = 25
stall_ms = 2000
"""
RIGHT, LEFT, ESC = "\x1b[C", "\x1b[D", "\x1b"


def wait_frames(client: ControlClient, episode_index: int, frames: int, timeout_s: float = 60.0) -> None:
    """Until the daemon's open episode has ``frames`` frames (bounded status polls)."""
    deadline = time.monotonic() + timeout_s
    while True:
        episode = client.call("status").get("episode") or {}
        if episode.get("index") == episode_index and episode.get("frames", 0) >= frames:
            return
        assert time.monotonic() < deadline, f"episode {episode_index} did not reach {frames} frames"
        time.sleep(0.05)  # between bounded status requests


def _stays_idle(client: ControlClient, seconds: float) -> None:
    """No take is recording for ``seconds`` (what a paused reset must hold)."""
    until = time.monotonic() + seconds
    while time.monotonic() < until:
        status = client.call("status")
        assert status["state"] == "idle" and status["episode"] is None, status["episode"]
        time.sleep(0.1)  # between bounded status requests


def collect_argv(config: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "hilrec.daemon.cli", "collect", "--config", str(config), *extra]


def test_three_takes_with_keys_in_the_terminal(tmp_path: Path) -> None:
    root = tmp_path / "ds"
    # The helper only writes the config (free ports); collect starts the daemon itself.
    daemon = Daemon(tmp_path, emulated_config(root, cameras=CAMERA))
    argv = collect_argv(
        daemon.config_path,
        "--episodes",
        "3",
        "--episode-time-s",
        str(TAKE_S),
        "--reset-time-s",
        "1",
        "--task",
        "pick the cube",
        "--no-sounds",
    )
    term = Terminal(argv, env=dict(os.environ))
    client = ControlClient(daemon.control, timeout_ms=3000, retries=5)
    try:
        term.wait_for(r"its log: \S+ds\.daemon\.log", 30)
        # Take 1: ended early with →.
        term.wait_for(r"take 1 of 3: recording episode 0", 180)
        wait_frames(client, 0, 50)
        term.send(RIGHT)
        first = int(term.wait_for(r"take 1 saved: episode 0, (\d+) frames \(ended by →\)", 30).group(1))
        # Take 2: thrown away with ←, recorded again, and left to run its time.
        term.wait_for(r"take 2 of 3: recording episode 1", 60)
        wait_frames(client, 1, 20)
        term.send(LEFT)
        term.wait_for(r"take 2: episode 1 discarded \(\d+ frames\); recording it again", 30)
        term.wait_for(r"take 2 of 3: recording episode 1", 60)
        second = int(term.wait_for(r"take 2 saved: episode 1, (\d+) frames \(ended by 4 s\)", 60).group(1))
        # Space in the reset pauses it: no take starts until space again.
        term.send(" ")
        term.wait_for(r"paused: space resumes", 30)
        _stays_idle(client, seconds=2.5)  # longer than the 1 s reset
        term.send(" ")
        term.wait_for(r"resumed", 30)
        # Take 3: Esc saves it and finishes the session.
        term.wait_for(r"take 3 of 3: recording episode 2", 60)
        wait_frames(client, 2, 50)
        term.send(ESC)
        third = int(term.wait_for(r"take 3 saved: episode 2, (\d+) frames \(ended by Esc\)", 30).group(1))
        term.wait_for(r"collect: 3 take\(s\) kept, 1 re-recorded, 0 discarded", 240)
        assert term.wait_exit(120) == 0
    finally:
        client.close()
        term.close()

    screen = term.text
    printed: dict[int, str] = {}
    for index in range(3):
        match = re.search(rf"verdict take \d \(episode {index}\): ([A-Z_]+): ", screen)
        assert match is not None, f"no verdict printed for episode {index}:\n{screen[-4000:]}"
        printed[index] = match.group(1).lower()
    # The takes, and nothing else, are in the dataset, with the lengths collect reported.
    episodes = load_episodes(root)
    assert [e["length"] for e in episodes] == [first, second, third]
    assert 50 <= first < TAKE_S * FPS and 50 <= third < TAKE_S * FPS
    # A timed take ends at the first tick edge after T: T * fps frames, less any slot the loaded
    # machine skipped (a skipped slot has no row; the sidecar counts them).
    meta, _ = load_episode_sidecar(root, 1)
    assert meta is not None
    skipped = int(meta["frame_flags"]["counts"].get("skipped", 0))
    assert TAKE_S * FPS - 4 - 2 * skipped <= second <= TAKE_S * FPS + 3, (second, skipped)
    for index in range(3):
        meta, arrays = load_episode_sidecar(root, index)
        assert meta is not None and meta["task"] == "pick the cube" and arrays["frame_flags"].size
        verdict: dict[str, Any] = meta["verdict"]
        assert verdict["verdict"] == printed[index] and verdict["summary"]
        # Judged by the hardware replay check (sound or, on a loaded machine, a warning or worse;
        # tests/collect/test_verdict.py holds each verdict to its cause).
        assert verdict["verdict"] in ("sound", "warning", "bad"), json.dumps(verdict)[:2000]
        assert verdict["details"]["replay"]["kind"] == "hardware"
        assert verdict["details"]["replay"]["frames"] == episodes[index]["length"]
    check_passes(root)
    result = run_cli("check", str(root))
    assert result.returncode == 0, result.stdout + result.stderr
    _lerobot_loads(root, frames=first + second + third)
    # The terminal was given back as it was (echo and line mode on again): nothing to see from
    # here, pexpect's pty is gone; tests/collect/test_keys.py checks the restore itself.


def _lerobot_loads(root: Path, *, frames: int) -> None:
    """LeRobot opens the dataset and reads its rows (no video decoder in this environment)."""
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    dataset = LeRobotDataset("local/collect-test", root=root)
    assert dataset.num_frames == frames and dataset.num_episodes == 3
    assert tuple(dataset.meta.features["observation.images.front"]["shape"]) == (48, 64, 3)
    row = dataset.hf_dataset[frames - 1]
    assert int(row["index"]) == frames - 1 and int(row["episode_index"]) == 2


def test_ctrl_c_saves_the_take_and_finishes_as_esc_does(tmp_path: Path) -> None:
    root = tmp_path / "ds"
    daemon = Daemon(tmp_path, sim_config(root))
    argv = collect_argv(
        daemon.config_path, "--episodes", "3", "--episode-time-s", "30", "--reset-time-s", "1", "--no-sounds"
    )
    term = Terminal(argv, env=dict(os.environ))
    client = ControlClient(daemon.control, timeout_ms=3000, retries=5)
    try:
        term.wait_for(r"take 1 of 3: recording episode 0", 120)
        wait_frames(client, 0, 25)
        term.send("\x03")  # Ctrl-C, typed: a byte in collect's raw terminal, not a SIGINT
        term.wait_for(r"Ctrl-C: saving the take and finishing, as Esc does", 30)
        frames = int(term.wait_for(r"take 1 saved: episode 0, (\d+) frames \(ended by Ctrl-C\)", 30).group(1))
        term.wait_for(r"verdict take 1 \(episode 0\): SOUND: ", 120)
        term.wait_for(r"collect: 1 take\(s\) kept, 0 re-recorded, 0 discarded", 120)
        assert term.wait_exit(120) == 0
    finally:
        client.close()
        term.close()
    assert [e["length"] for e in load_episodes(root)] == [frames]
    check_passes(root)
