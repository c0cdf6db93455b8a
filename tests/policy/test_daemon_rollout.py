"""A rollout in the emulated daemon: a scripted policy drives the emulated follower through the
loop, ``hilrec ctl takeover`` and ``handback`` switch it, and the frames say who drove; killing
the policy's process is a fault that holds the arm, says why, and loses no saved take."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "daemon"))
import _daemon
from _daemon import Daemon, check_passes, emulated_config, run_cli

from hilrec.daemon.dataset import FrameFlag
from hilrec.daemon.dataset.format.reader import load_episodes, read_episode
from hilrec.daemon.dataset.format.sidecar import load_episode_sidecar

# Real daemons, processes or kill loops: the slow tier (make test runs it; make test-fast does not).
pytestmark = pytest.mark.slow

POLICIES = Path(__file__).with_name("_policies.py")
MAX_STEP = 6.0


def policy_config(root: Path, name: str) -> str:
    return emulated_config(
        root,
        extra=f'[policy]\nspec = "{POLICIES}:{name}"\ntakeover = "key"\nmax_relative_target = {MAX_STEP}\n',
    )


@pytest.fixture
def daemon(tmp_path: Path, request: pytest.FixtureRequest):
    started = Daemon(tmp_path, policy_config(tmp_path / "ds", request.param)).start()
    yield started
    started.close()


def ctl(daemon: Daemon, verb: str) -> None:
    done = run_cli("ctl", verb, "--port", str(daemon.control_port), timeout_s=60)
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize("daemon", ["Sway"], indirect=True)
def test_takeover_and_handback_through_ctl_are_labelled_and_do_not_jump(
    daemon: Daemon, tmp_path: Path
) -> None:
    root = tmp_path / "ds"
    assert daemon.call("status")["leader"]["control"] == "human"  # between takes
    daemon.call("start_episode", task="sway")
    assert daemon.call("status")["leader"]["control"] == "policy"
    daemon.wait_frames(40)
    ctl(daemon, "takeover")
    assert daemon.call("status")["leader"]["control"] == "human"
    at_takeover = daemon.call("status")["episode"]["frames"]
    daemon.wait_frames(at_takeover + 40)
    ctl(daemon, "handback")
    at_handback = daemon.call("status")["episode"]["frames"]
    daemon.wait_frames(at_handback + 40)
    daemon.call("stop_episode")
    daemon.wait_saved(1)
    daemon.shutdown()  # merged into LeRobot's files at the latest on the way out

    rows = read_episode(root, 0, ["intervention", "action"])
    intervention = rows["intervention"].reshape(-1)
    switches = np.flatnonzero(np.diff(intervention.astype(np.int8))) + 1
    assert not intervention[0] and not intervention[-1] and len(switches) == 2
    assert intervention[switches[0] : switches[1]].all()
    sidecar, arrays = load_episode_sidecar(root, 0)
    assert sidecar is not None
    rollout = sidecar["rollout"]
    assert rollout["takeovers"] == 1 and rollout["handbacks"] == 1
    assert [s["frame"] for s in rollout["switches"]] == switches.tolist()
    # The goal steps at each switch, from the recorded actions: within the per-tick clamp while
    # the goal catches up with the new hand (the emulated leader's scripted hand is elsewhere when
    # the person takes over). The catch-up ends with its first step short of the clamp; after it
    # the goal is the hand's own, which may move faster than the clamp per tick.
    action = rows["action"].astype(np.float64)
    for frame in switches:
        steps = np.abs(np.diff(action[frame - 1 : frame + 25], axis=0)).max(axis=1)
        ramp_end = next((i for i, s in enumerate(steps) if s < MAX_STEP - 1e-3), len(steps) - 1)
        assert steps[: ramp_end + 1].max() <= MAX_STEP + 1e-3, (frame, steps)
    n = len(intervention)
    assert arrays["policy_action"].shape == (n, 6) and arrays["control_source"].shape == (n,)
    assert arrays["action_age_ticks"].shape == (n,) and arrays["inference_latency_s"].shape == (n,)
    assert rollout["inference_latency_s"]["p50"] is not None
    check_passes(root)
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    ds = LeRobotDataset("hilrec/rollout", root=root, video_backend="pyav")
    assert "intervention" in ds.features and len(ds) == n


@pytest.mark.parametrize("daemon", ["huge"], indirect=True)
def test_refused_outputs_never_reach_the_servos(daemon: Daemon, tmp_path: Path) -> None:
    root = tmp_path / "ds"
    daemon.call("start_episode", task="huge")
    daemon.wait_frames(30)
    daemon.call("stop_episode")
    daemon.wait_saved(1)
    status = daemon.call("status")
    assert status["leader"]["refused_answers"] > 0 and "1e+06" in status["leader"]["last_refusal"]
    daemon.shutdown()
    rows = read_episode(root, 0, ["action", "observation.state"])
    _, arrays = load_episode_sidecar(root, 0)
    flags = arrays["frame_flags"]
    # Every tick held: starved (each answer refused), or, where a loaded machine made an emulated
    # arm's read fail (seen in a clean-clone make test), held for that failure before the policy
    # was asked. No tick executed a policy goal: the goal sent never moved from the first one.
    held = FrameFlag.STARVED | FrameFlag.LEADER_FAILED
    assert ((flags & held) != 0).all() and (flags & FrameFlag.POLICY_REFUSED).any(), flags
    assert (flags & FrameFlag.STARVED).any(), flags
    np.testing.assert_array_equal(rows["action"], np.repeat(rows["action"][:1], len(rows["action"]), axis=0))


@pytest.mark.parametrize("daemon", ["hold_still"], indirect=True)
def test_a_killed_policy_process_faults_holds_and_keeps_every_take(daemon: Daemon, tmp_path: Path) -> None:
    root = tmp_path / "ds"
    daemon.call("start_episode", task="first")
    daemon.wait_frames(20)
    daemon.call("stop_episode")
    daemon.wait_saved(1)
    daemon.call("start_episode", task="second")
    daemon.wait_frames(20)
    pid = daemon.call("status")["devices"]["policy"]["pid"]
    os.kill(pid, signal.SIGKILL)
    status = daemon.wait_status(
        lambda s: any(f["kind"] == "policy" for f in s["faults"]), what="the policy fault"
    )
    fault = next(f for f in status["faults"] if f["kind"] == "policy")
    assert "ended" in fault["message"] and str(pid) in fault["message"]
    daemon.wait_saved(2)
    status = daemon.wait_status(lambda s: s["state"] == "idle", what="the take ended by the fault")
    assert status["last_episode"]["ended_by"].startswith("fault:policy")
    refused = daemon.request("start_episode", task="third")
    assert not refused["ok"] and "policy" in refused["error"]
    daemon.shutdown()
    assert [e["episode_index"] for e in load_episodes(root)] == [0, 1]
    check_passes(root)


TWIN_CAMERA = """
[cameras.front]
source = "twin"
height = 48
width = 64
fps = 25
stall_ms = 2000
"""


def test_a_tiny_lerobot_act_drives_the_emulated_follower(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
    from tiny_act import train_tiny_act

    act = train_tiny_act(tmp_path / "act")
    # torch's import and a warm-up inference in the policy's process, on a shared machine.
    monkeypatch.setattr(_daemon, "START_TIMEOUT_S", 300.0)
    root = tmp_path / "ds"
    extra = f'[policy]\nspec = "{act}"\ntakeover = "off"\n'
    daemon = Daemon(tmp_path, emulated_config(root, cameras=TWIN_CAMERA, extra=extra)).start()
    try:
        daemon.call("start_episode", task="act")
        # Behaviour, not timing: wait until chunks from the policy's process have been used.
        daemon.wait_status(lambda s: s["leader"]["fresh_chunks"] >= 3, timeout_s=180, what="3 chunks used")
        refused = daemon.request("takeover")
        assert not refused["ok"] and "off" in refused["error"], refused
        daemon.call("stop_episode")
        daemon.wait_saved(1)
        daemon.shutdown()
    finally:
        daemon.close()
    _, arrays = load_episode_sidecar(root, 0)
    assert arrays["chunk_fresh"].any()  # chunks arrived and were used
    used = arrays["action_age_ticks"] >= 0
    assert used.any()
    np.testing.assert_array_equal(
        np.isnan(arrays["policy_action"]).any(axis=1), ~used
    )  # a proposal on exactly the ticks that had a goal due
    assert (arrays["control_source"] == 0).all()
    check_passes(root)
