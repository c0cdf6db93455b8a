"""``hilrec rollout`` end to end on emulated arms: a scripted policy drives, keys typed into the
session's own terminal (a pty) take over, hand back and mark the outcome; with ``--record
corrections`` only the correction windows are recorded, one episode each. The datasets pass the
check and load in LeRobot 0.4.4 with the ``intervention`` column."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from _daemon import Daemon, check_passes, emulated_config
from _terminal import Terminal

from hilrec.daemon.dataset.format.reader import load_episodes, read_episode
from hilrec.daemon.dataset.format.sidecar import load_episode_sidecar
from hilrec.daemon.wire.client import ControlClient

pytestmark = pytest.mark.slow

POLICIES = Path(__file__).resolve().parents[1] / "policy" / "_policies.py"


def rollout_argv(config: Path, *extra: str) -> list[str]:
    return [
        sys.executable, "-m", "hilrec.daemon.cli", "rollout", "--config", str(config),
        "--policy", f"{POLICIES}:hold_still", "--no-sounds", "--reset-time-s", "0.5", *extra,
    ]  # fmt: skip


def wait_frames(client: ControlClient, frames: int, timeout_s: float = 60.0) -> int:
    """Until the open episode has ``frames`` more frames than now; its frame count then."""
    deadline = time.monotonic() + timeout_s
    start = None
    while True:
        episode = client.call("status").get("episode") or {}
        count = int(episode.get("frames") or 0)
        start = count if start is None else start
        if episode and count >= start + frames:
            return count
        assert time.monotonic() < deadline, f"the episode did not grow by {frames} frames"
        time.sleep(0.05)  # between bounded status requests


def lerobot_loads(root: Path, frames: int, episodes: int) -> None:
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    dataset = LeRobotDataset("local/rollout-test", root=root)
    assert dataset.num_frames == frames and dataset.num_episodes == episodes
    assert "intervention" in dataset.hf_dataset.column_names


def test_space_takes_over_and_hands_back_and_s_marks_a_success(tmp_path: Path) -> None:
    root = tmp_path / "ds"
    daemon = Daemon(tmp_path, emulated_config(root))
    term = Terminal(
        rollout_argv(daemon.config_path, "--episodes", "1", "--episode-time-s", "120"), env=dict(os.environ)
    )
    client = ControlClient(daemon.control, timeout_ms=3000, retries=5)
    try:
        term.wait_for(r"take 1 of 1: recording episode 0", 180)
        wait_frames(client, 25)
        term.send(" ")
        term.wait_for(r"the human has the arm", 30)
        wait_frames(client, 25)
        term.send(" ")
        term.wait_for(r"the policy has the arm", 30)
        wait_frames(client, 25)
        term.send("s")
        frames = int(term.wait_for(r"take 1 saved: episode 0, (\d+) frames \(ended by s\)", 30).group(1))
        term.wait_for(r"verdict take 1 \(episode 0\): [A-Z_]+: .*the human took over 1 time", 180)
        term.wait_for(r"take 1: episode 0, \d+ frames, ended by s, marked success", 180)
        assert term.wait_exit(120) == 0
    finally:
        client.close()
        term.close()
    intervention = read_episode(root, 0, ["intervention"])["intervention"].reshape(-1)
    assert len(intervention) == frames
    switches = np.flatnonzero(np.diff(intervention.astype(np.int8))) + 1
    assert not intervention[0] and not intervention[-1] and len(switches) == 2
    meta, _ = load_episode_sidecar(root, 0)
    assert meta is not None and meta["success"] is True and meta["rollout"]["outcome"] == "success"
    summary = meta["rollout"]
    assert summary["takeovers"] == 1 and summary["handbacks"] == 1 and 0 < summary["human_share"] < 1
    assert (
        summary["inference_latency_s"]["p50"] is not None
        and summary["inference_latency_s"]["p99"] is not None
    )
    assert meta["verdict"]["details"]["rollout"]["takeover_s"] == [round(int(switches[0]) / 25, 2)]
    check_passes(root)
    lerobot_loads(root, frames, 1)


def test_record_corrections_saves_each_window_as_an_episode(tmp_path: Path) -> None:
    root = tmp_path / "ds"
    daemon = Daemon(tmp_path, emulated_config(root))
    argv = rollout_argv(
        daemon.config_path, "--episodes", "1", "--episode-time-s", "120", "--record", "corrections"
    )
    term = Terminal(argv, env=dict(os.environ))
    client = ControlClient(daemon.control, timeout_ms=3000, retries=5)
    try:
        term.wait_for(r"take 1 of 1: the policy drives; corrections are recorded", 180)
        time.sleep(1.0)  # the policy drives unrecorded for a while (nothing to wait on: nothing happens)
        assert client.call("status")["episode"] is None
        term.send(" ")
        term.wait_for(r"correction: recording episode 0", 30)
        wait_frames(client, 40)
        term.send(" ")
        first = int(
            term.wait_for(r"take 1 saved: episode 0, (\d+) frames \(ended by handback\)", 30).group(1)
        )
        term.wait_for(r"the policy has the arm", 30)
        assert client.call("status")["episode"] is None
        term.send(" ")
        term.wait_for(r"correction: recording episode 1", 30)
        wait_frames(client, 40)
        term.send("f")
        second = int(term.wait_for(r"take 1 saved: episode 1, (\d+) frames \(ended by f\)", 30).group(1))
        term.wait_for(r"rollout: 2 take\(s\) kept", 240)
        assert term.wait_exit(120) == 0
    finally:
        client.close()
        term.close()
    assert [e["length"] for e in load_episodes(root)] == [first, second]
    for index in (0, 1):
        assert read_episode(root, index, ["intervention"])["intervention"].all()
        meta, arrays = load_episode_sidecar(root, index)
        assert meta is not None and meta["rollout"]["record"] == "corrections"
        assert (arrays["control_source"] == 1).all()
        assert meta["success"] is (None if index == 0 else False)
        assert meta["rollout"]["outcome"] == (None if index == 0 else "failure")
    check_passes(root)
    lerobot_loads(root, first + second, 2)
