"""The daemon end to end in emulated mode: real serial transactions with emulated STS3215 arms,
cameras, the mirroring twin, and the fault table of the issue. Driven only over ZeroMQ."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import numpy as np
import pytest
from _daemon import Daemon, check_passes, emulated_config, write_test_video
from support.procs import children
from support.verdicts import VERDICT_MODULE

from hilrec.daemon.dataset import FrameFlag
from hilrec.daemon.dataset.format.reader import load_episodes, read_episode
from hilrec.daemon.dataset.format.sidecar import load_dataset_sidecar, load_episode_sidecar

# Real daemons, processes or kill loops: the slow tier (make test runs it; make test-fast does not).
pytestmark = pytest.mark.slow


@pytest.fixture
def daemons(tmp_path: Path):
    started: list[Daemon] = []

    def make(config: str) -> Daemon:
        daemon = Daemon(tmp_path, config)
        started.append(daemon)
        return daemon.start()

    yield make
    for daemon in started:
        daemon.close()


def test_records_hardware_episodes_with_twin_divergence_and_marked_bus_retries(
    tmp_path: Path, daemons
) -> None:
    root = tmp_path / "ds"
    video = write_test_video(tmp_path / "side.mp4", frames=50)
    cameras = f"""
[cameras.front]
source = "twin"
height = 48
width = 64
fps = 25
stall_ms = 2000
[cameras.side]
source = "video"
path = "{video}"
height = 48
width = 64
loop = true
"""
    # Lost and corrupt replies: the bus retries them, the frame is marked, nothing else happens.
    faults = 'follower_faults = ["drop:p=0.05"]\nleader_faults = ["corrupt:p=0.05"]'
    daemon = daemons(emulated_config(root, cameras=cameras, faults=faults))
    status = daemon.call("status")
    assert status["mode"] == "emulated" and status["leader"]["source"] == "serial"
    assert status["devices"]["follower"]["port"].startswith("/dev/pts/")
    # The verdict worker starts with the first take: a daemon that never records never starts it.
    assert status["verdicts"]["priority"] == "not started"
    assert daemon.process is not None and children(daemon.process.pid, VERDICT_MODULE) == []

    daemon.call("start_episode", task="pick the cube", seed=11)
    daemon.wait_frames(60)
    daemon.call("stop_episode", success=True)
    daemon.call("start_episode", task="thrown away")
    daemon.wait_frames(5)
    daemon.call("discard_episode")
    status = daemon.wait_status(
        lambda s: (
            s["dataset"]["saved_this_session"] == 1
            and s["dataset"]["saving"] == 0
            and s["dataset"]["discarded_this_session"] == 1
        ),
        what="one saved, one discarded",
    )
    assert not status["faults"]
    assert daemon.shutdown() == 0

    check_passes(root)
    [episode] = load_episodes(root)
    meta, arrays = load_episode_sidecar(root, 0)
    assert meta is not None and meta["mode"] == "emulated" and meta["seed"] == 11
    assert meta["success"] is True and meta["frames"] == episode["length"]
    flags = arrays["frame_flags"]
    assert np.count_nonzero(flags & int(FrameFlag.FOLLOWER_RETRIED)) > 0
    assert np.count_nonzero(flags & int(FrameFlag.LEADER_RETRIED)) > 0
    assert meta["frame_flags"]["counts"]["follower_retried"] == np.count_nonzero(flags & 1)
    # The twin followed the measured joints; the divergences are summarised per joint.
    divergence = meta["divergence"]
    assert {"tracking", "twin_vs_measured", "twin_vs_commanded"} <= set(divergence)
    assert all(len(divergence[k]["max_abs"]) == 6 for k in ("tracking", "twin_vs_measured"))
    assert arrays["twin_state"].shape == (episode["length"], 6)
    columns = read_episode(root, 0, columns=["observation.state", "action"])
    twin_error = np.abs(arrays["twin_state"][1:].astype(np.float64) - columns["observation.state"][1:])
    assert np.max(twin_error[:, :5]) < 45.0  # degrees: the twin tracks the arm, not a fixed pose
    # Timing arrays: one entry per frame, on one deadline grid.
    slots = arrays["tick_slot"]
    assert len(slots) == episode["length"] and np.all(np.diff(slots) >= 1)
    np.testing.assert_allclose(np.diff(arrays["tick_deadline"]), np.diff(slots) * 0.04, atol=1e-6)
    dataset = load_dataset_sidecar(root)
    assert dataset is not None and dataset["units"]["body_norm_mode"] == "degrees"
    assert set(dataset["calibration"]) == {"follower", "leader"}
    _lerobot_loads(root, episode["length"])


@pytest.mark.parametrize(("policy", "device"), [("save", "follower"), ("discard", "leader")])
def test_a_vanished_port_ends_the_open_episode_by_policy_and_is_reported(
    tmp_path: Path, daemons, policy: str, device: str
) -> None:
    root = tmp_path / "ds"
    daemon = daemons(emulated_config(root, on_device_lost=policy))
    daemon.call("start_episode", task="unplugged", seed=1)
    daemon.wait_frames(25)
    # The emulator process dies: its pty closes under the daemon, as when a USB cable is pulled.
    os.kill(daemon.call("status")["devices"][device]["emulator_pid"], signal.SIGKILL)
    status = daemon.wait_status(
        lambda s: any(f["device"] == device for f in s["faults"]), what=f"{device} fault"
    )
    fault = next(f for f in status["faults"] if f["device"] == device)
    assert fault["kind"] == "device_lost" and "port" in fault["message"]
    status = daemon.wait_status(
        lambda s: s["state"] == "idle" and s["dataset"]["saving"] == 0, what="episode closed"
    )
    last = status["last_episode"]
    assert last["ended_by"] == f"fault:device_lost:{device}"
    refused = daemon.request("start_episode", task="again")
    assert not refused["ok"] and refused["code"] == "fault" and device in refused["error"]
    assert daemon.shutdown() == 0  # nothing hangs on the dead port
    episodes = load_episodes(root) if (root / "meta" / "episodes").exists() else []
    if policy == "save":
        assert last.get("saved") is True and len(episodes) == 1 and episodes[0]["length"] >= 25
        meta, _ = load_episode_sidecar(root, 0)
        assert meta is not None and meta["faults"][0]["device"] == device
        check_passes(root)
    else:
        assert last.get("discarded") is True and episodes == []


def test_a_stalled_camera_saves_the_open_episode_and_shows_the_fault(tmp_path: Path, daemons) -> None:
    root = tmp_path / "ds"
    # A video file that is not looped runs dry after 4 s: the camera stops delivering frames.
    video = write_test_video(tmp_path / "short.mp4", frames=100)
    cameras = f"""
[cameras.side]
source = "video"
path = "{video}"
height = 48
width = 64
loop = false
stall_ms = 300
"""
    daemon = daemons(emulated_config(root, cameras=cameras))
    telemetry = daemon.telemetry()
    daemon.call("start_episode", task="until the camera stops")
    status = daemon.wait_status(
        lambda s: any(f["kind"] == "camera_stalled" for f in s["faults"]), what="camera stall fault"
    )
    assert status["faults"][0]["device"] == "camera.side"
    event = telemetry.wait_for(lambda topic, h: topic == "event" and h["event"] == "fault", 10.0)
    assert event is not None and event[1]["fault"]["kind"] == "camera_stalled"
    tick = telemetry.wait_for(lambda topic, h: topic == "tick" and "camera.side" in h["faults"], 10.0)
    assert tick is not None and tick[1]["recording"] is False
    telemetry.close()
    daemon.wait_saved(1)
    assert daemon.shutdown() == 0
    check_passes(root)
    [episode] = load_episodes(root)
    meta, _ = load_episode_sidecar(root, 0)
    assert meta is not None and meta["ended_by"] == "fault:camera_stalled:camera.side"
    assert episode["length"] > 10


def _lerobot_loads(root: Path, frames: int) -> None:
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    dataset = LeRobotDataset("local/emulated-test", root=root)
    assert dataset.num_frames == frames and dataset.meta.robot_type == "so_follower"
    assert set(dataset.meta.video_keys) == {"observation.images.front", "observation.images.side"}
    row = dataset.hf_dataset[frames - 1]
    assert len(row["observation.state"]) == 6


def test_a_remote_leaders_out_of_range_goals_reach_the_servos_clamped_and_are_recorded_clamped(
    tmp_path: Path, daemons
) -> None:
    from hilrec.daemon.so101 import NormMode
    from hilrec.drivers.calibration import MotorCalibration, units_to_ticks

    root = tmp_path / "ds"
    config = emulated_config(root).replace('source = "serial"', 'source = "remote"\nwatchdog_ms = 1000')
    daemon = daemons(config)
    leader = daemon.leader()
    wild = [720.0, -1000.0, 0.0, 0.0, 0.0, 150.0]
    try:
        for _ in range(50):  # until the loop has taken one (a bounded number of tries)
            leader.send(wild)
            status = daemon.call("status")
            if status["leader"]["state"] == "live":
                break
        daemon.call("start_episode", task="wild goals")
        for _ in range(200):
            leader.send(wild)
            if daemon.call("status")["episode"]["frames"] >= 10:
                break
        daemon.call("stop_episode")
        daemon.wait_saved(1)
    finally:
        leader.close()
    assert daemon.shutdown() == 0
    actions = read_episode(root, 0, columns=["action"])["action"]
    _, arrays = load_episode_sidecar(root, 0)
    flags = arrays["frame_flags"]
    commanded = [i for i in range(len(actions)) if not flags[i] & int(FrameFlag.LEADER_STALE)]
    assert commanded, "no frame carried the wild command"
    sidecar = load_dataset_sidecar(root)
    assert sidecar is not None
    calibration = sidecar["calibration"]["follower"]
    for i in commanded:
        assert flags[i] & int(FrameFlag.CLAMPED), f"frame {i} not flagged clamped: {actions[i]}"
        for joint, value in zip(calibration, actions[i], strict=True):
            cal = MotorCalibration(**calibration[joint])
            mode = NormMode.RANGE_0_100 if joint == "gripper" else NormMode.DEGREES
            assert cal.range_min <= units_to_ticks(float(value), cal, mode) <= cal.range_max, (joint, value)
    assert float(actions[commanded[-1]][5]) == 100.0
