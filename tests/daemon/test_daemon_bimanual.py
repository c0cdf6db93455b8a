"""The daemon with two arm pairs (configs/bimanual-emulated.toml's shape): four emulated arms,
both buses of a tick read at once, LeRobot's bi_so_follower columns, the read skew beside the
episode, and a fault on one arm ending the take by policy with the arm named."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import numpy as np
import pytest
from _daemon import Daemon, check_passes, emulated_config

from hilrec.daemon.dataset.format.reader import load_episodes, load_info, read_episode
from hilrec.daemon.dataset.format.sidecar import load_dataset_sidecar, load_episode_sidecar
from hilrec.daemon.so101 import position_names

pytestmark = pytest.mark.slow

CAMERA = """
[cameras.front]
source = "twin"
height = 48
width = 64
fps = 25
stall_ms = 2000
"""
# Four emulators on a shared 2-core machine: a longer reply timeout than one arm pair needs (and,
# as every emulated test daemon has, two seconds of failed reads before an arm counts as lost).
REPLY_TIMEOUT_MS = 30.0
ARMS = "[arms.left]\n[arms.right]\n"
SIDES = ("left", "right")
ROLES = ("follower", "leader")


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


def test_two_arms_record_bi_so_follower_columns_with_the_skew_of_each_tick(tmp_path: Path, daemons) -> None:
    root = tmp_path / "ds"
    daemon = daemons(emulated_config(root, cameras=CAMERA, extra=ARMS, bus_reply_timeout_ms=REPLY_TIMEOUT_MS))
    devices = daemon.call("status")["devices"]
    arms = [f"{side}_{role}" for side in SIDES for role in ROLES]
    assert set(devices) == set(arms)
    assert len({devices[a]["emulator_pid"] for a in arms}) == 4  # four emulated arms
    assert len({devices[a]["port"] for a in arms}) == 4 and all(
        devices[a]["port"].startswith("/dev/pts/") for a in arms
    )
    daemon.call("start_episode", task="both arms", seed=3)
    daemon.wait_frames(40, timeout_s=60.0)
    daemon.call("stop_episode", success=True)
    daemon.wait_status(
        lambda s: s["dataset"]["saved_this_session"] == 1 and s["dataset"]["saving"] == 0, what="saved"
    )
    assert daemon.shutdown() == 0

    check_passes(root)
    info = load_info(root)
    assert info["robot_type"] == "bi_so_follower"
    for key in ("observation.state", "action"):
        assert info["features"][key]["names"] == position_names(2) and info["features"][key]["shape"] == [12]
    [episode] = load_episodes(root)
    n = episode["length"]
    meta, arrays = load_episode_sidecar(root, 0)
    assert meta is not None and meta["divergence"]["joints"][6] == "right_shoulder_pan"
    assert arrays["leader"].shape == (n, 12) and arrays["twin_state"].shape == (n, 12)
    for name in ("tick_follower_skew_s", "tick_leader_skew_s"):
        skew = arrays[name]
        assert skew.shape == (n,) and np.count_nonzero(np.isfinite(skew)) > n // 2
        assert np.all(skew[np.isfinite(skew)] >= 0)
    assert "follower_skew_ms_p99" in meta["timing"] and "leader_skew_ms_p50" in meta["timing"]
    # Two arms, each its own: the seeds differ, so the operators' hands (and the followers) do.
    state = read_episode(root, 0, columns=["observation.state"])["observation.state"]
    assert not np.allclose(state[:, :6], state[:, 6:])
    # The two-arm twin mirrored both followers: each half of it follows its own arm, not the other.
    twin = arrays["twin_state"].astype(np.float64)
    for own, other in ((slice(0, 5), slice(6, 11)), (slice(6, 11), slice(0, 5))):
        assert np.median(np.abs(twin[1:, own] - state[1:, own])) < np.median(
            np.abs(twin[1:, own] - state[1:, other])
        )
    sidecar = load_dataset_sidecar(root)
    assert sidecar is not None
    assert set(sidecar["calibration"]) == set(arms) and sidecar["units"]["arms"] == list(SIDES)
    # LeRobot 0.4.4 reads it as its own bi_so_follower's: the same 12 floats, bit for bit.
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    dataset = LeRobotDataset("local/bimanual-emulated", root=root)
    assert dataset.meta.robot_type == "bi_so_follower" and dataset.num_frames == n
    row = dataset.hf_dataset[n - 1]
    assert np.array_equal(np.asarray(row["observation.state"], dtype=np.float32), state[n - 1])


@pytest.mark.parametrize(("policy", "arm"), [("save", "right_follower"), ("discard", "left_leader")])
def test_a_lost_arm_ends_the_take_by_policy_and_names_the_arm(
    tmp_path: Path, daemons, policy: str, arm: str
) -> None:
    root = tmp_path / "ds"
    config = emulated_config(root, extra=ARMS, on_device_lost=policy, bus_reply_timeout_ms=REPLY_TIMEOUT_MS)
    daemon = daemons(config)
    daemon.call("start_episode", task="unplugged", seed=1)
    daemon.wait_frames(25, timeout_s=60.0)
    os.kill(daemon.call("status")["devices"][arm]["emulator_pid"], signal.SIGKILL)
    side, role = arm.split("_")
    status = daemon.wait_status(lambda s: any(f["device"] == role for f in s["faults"]), what=f"{arm} fault")
    fault = next(f for f in status["faults"] if f["device"] == role)
    assert fault["kind"] == "device_lost" and fault["message"].startswith(f"{side} {role}: "), fault
    status = daemon.wait_status(
        lambda s: s["state"] == "idle" and s["dataset"]["saving"] == 0, what="the take closed"
    )
    last = status["last_episode"]
    assert last["ended_by"] == f"fault:device_lost:{role}"
    assert daemon.shutdown() == 0
    episodes = load_episodes(root) if (root / "meta" / "episodes").exists() else []
    if policy == "save":
        assert last.get("saved") is True and len(episodes) == 1
        meta, _ = load_episode_sidecar(root, 0)
        assert meta is not None and f"{side} {role}: " in meta["faults"][0]["message"]
        check_passes(root)
    else:
        assert last.get("discarded") is True and episodes == []


def test_sim_mode_with_two_arms_records_the_handover_and_it_replays_bit_for_bit(
    tmp_path: Path, daemons
) -> None:
    from _daemon import sim_config

    from hilrec.sim.replay import replay_check

    root = tmp_path / "ds"
    daemon = daemons(sim_config(root, realtime=False, extra=ARMS))
    daemon.call("start_episode", task="hand it over", seed=4)
    daemon.wait_frames(30)
    daemon.call("stop_episode")
    status = daemon.wait_status(
        lambda s: s["dataset"]["saved_this_session"] == 1 and s["dataset"]["saving"] == 0, what="saved"
    )
    assert status["last_episode"]["saved"] is True
    assert daemon.shutdown() == 0
    check_passes(root)
    info = load_info(root)
    assert info["robot_type"] == "bi_so_follower" and info["features"]["action"]["names"] == position_names(2)
    report = replay_check(root, episodes=[0], undisturbed=False)
    assert [e.status for e in report.episodes] == ["passed"], report
    meta, arrays = load_episode_sidecar(root, 0)
    assert meta is not None and meta["seed"] == 4 and arrays["leader"].shape[1] == 12
    assert "tick_follower_skew_s" not in arrays  # one twin, no buses: no skew to keep


def test_a_sigkilled_two_arm_daemon_takes_its_four_emulators_with_it(tmp_path: Path, daemons) -> None:
    import time

    from test_orphans import EXIT_TIMEOUT_S, alive

    daemon = daemons(emulated_config(tmp_path / "ds", extra=ARMS, bus_reply_timeout_ms=REPLY_TIMEOUT_MS))
    assert daemon.process is not None
    devices = daemon.call("status")["devices"]
    pids = [int(devices[f"{side}_{role}"]["emulator_pid"]) for side in SIDES for role in ROLES]
    daemon.call("start_episode", task="killed mid-take")
    daemon.wait_frames(5, timeout_s=60.0)
    os.kill(daemon.process.pid, signal.SIGKILL)
    daemon.process.wait(10)
    deadline = time.monotonic() + EXIT_TIMEOUT_S
    while any(alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.05)  # polling a condition (process exit) with a deadline
    orphans = [pid for pid in pids if alive(pid)]
    for pid in orphans:
        os.kill(pid, signal.SIGKILL)
    assert orphans == [], f"emulators still running {EXIT_TIMEOUT_S} s after their daemon died"
