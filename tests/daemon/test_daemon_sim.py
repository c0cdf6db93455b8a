"""The daemon end to end in sim mode: a subprocess driven only over ZeroMQ.

Sim mode is the fast way to exercise the protocol, the episode lifecycle and the signals; the
hardware path (serial arms, bus faults, port loss) is in test_daemon_emulated.py.
"""

from __future__ import annotations

import json
import signal
import threading
import time
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import pytest
import zmq
import zmq.auth
from _daemon import Daemon, check_passes, run_cli, sim_config

from hilrec.daemon.dataset import FrameFlag
from hilrec.daemon.dataset.format.reader import load_episodes, read_episode
from hilrec.daemon.dataset.format.sidecar import load_dataset_sidecar, load_episode_sidecar
from hilrec.daemon.errors import DaemonUnreachableError
from hilrec.daemon.wire.client import ClientKeys, ControlClient
from hilrec.daemon.wire.protocol import PROTOCOL_VERSION, new_request

# Real daemons, processes or kill loops: the slow tier (make test runs it; make test-fast does not).
pytestmark = pytest.mark.slow


@pytest.fixture
def daemons(tmp_path: Path):
    started: list[Daemon] = []

    def make(config: str, *, args: tuple[str, ...] = (), **kwargs: Any) -> Daemon:
        daemon = Daemon(tmp_path, config, **kwargs)
        started.append(daemon)
        return daemon.start(args=args)

    yield make
    for daemon in started:
        daemon.close()


def test_records_episodes_over_zeromq_while_refusing_bad_requests(tmp_path: Path, daemons) -> None:
    root = tmp_path / "ds"
    daemon = daemons(sim_config(root))
    telemetry = daemon.telemetry()
    status = daemon.call("status")
    assert status["v"] == PROTOCOL_VERSION and status["state"] == "idle" and status["mode"] == "sim"

    started = daemon.call("start_episode", task="put the cube in the bin", seed=3)
    assert started["episode_index"] == 0 and started["seed"] == 3
    again = daemon.request("start_episode", task="again")
    assert not again["ok"] and "already recording" in again["error"] and again["code"] == "bad_state"
    daemon.wait_frames(5)

    assert daemon.client is not None
    bad = {
        b"this is not json": "not valid JSON",
        b'{"cmd": "launch"}': "unknown command 'launch'",
        b'{"cmd": "status", "v": 99}': "protocol version int 99",
        b'{"cmd": "stop_episode", "success": "yes"}': "'success' must be bool",
        json.dumps({"cmd": "start_episode", "task": "x" * 70000}).encode(): "over the limit of 65536 bytes",
    }
    for payload, fragment in bad.items():
        reply = daemon.client.send_raw(payload)
        assert not reply["ok"] and fragment in reply["error"], reply
    multipart = daemon.client.send_raw([b'{"cmd": "status"}', b"x"])
    assert not multipart["ok"] and "2 frames" in multipart["error"]
    before = daemon.call("status")["episode"]["frames"]
    daemon.wait_frames(before + 5)  # recording carried on through the refusals

    # A Lazy-Pirate retry resends the same request id: the daemon answers from its cache.
    stop = new_request("stop_episode", success=True).encode()
    first, second = daemon.client.send_raw(stop), daemon.client.send_raw(stop)
    assert first["ok"] and first == second and first["episode_index"] == 0

    daemon.call("start_episode", task="to be thrown away", seed=4)
    daemon.wait_frames(3)
    assert daemon.call("discard_episode")["discarded"] is True
    assert daemon.call("start_episode", task="put the cube in the bin", seed=5)["episode_index"] == 1
    daemon.wait_frames(8)
    daemon.call("stop_episode", success=False)
    status = daemon.wait_saved(2)
    assert status["dataset"]["discarded_this_session"] == 1 and not status["faults"]
    nothing = daemon.request("stop_episode")
    assert not nothing["ok"] and "no episode is recording" in nothing["error"]

    assert daemon.call("finalize")["finalizing"] is True
    daemon.wait_status(lambda s: s["dataset"]["finalized"], what="finalized")
    late = daemon.request("start_episode", task="too late")
    assert not late["ok"] and "finalized" in late["error"]

    assert daemon.shutdown() == 0
    seen = _drain(telemetry)  # what arrived before the publisher closed
    telemetry.close()

    ticks = [h for t, h, _ in seen if t == "tick"]
    recorded = [h for h in ticks if h["recording"]]
    assert recorded and all(len(h["state"]) == 6 and len(h["action"]) == 6 for h in recorded)
    assert all(
        h["v"] == PROTOCOL_VERSION and {"late_ms", "duration_ms", "leader_to_write_ms"} <= set(h["timing"])
        for h in recorded
    )
    previews = [(h, frames) for t, h, frames in seen if t == "preview"]
    assert previews
    header, jpegs = previews[-1]
    image = cv2.imdecode(np.frombuffer(jpegs[0], np.uint8), cv2.IMREAD_COLOR)
    assert image is not None and image.shape == (header["cameras"][0]["height"], 32, 3)
    events = [h["event"] for t, h, _ in seen if t == "event"]
    assert events.count("episode_saved") == 2 and "episode_discarded" in events
    assert events[-1] == "daemon_stopped"

    # The sim episodes replay bit for bit from their recorded start states.
    check = run_cli("check", str(root), "--replay")
    assert check.returncode == 0 and "replay PASSED" in check.stdout, check.stdout + check.stderr
    episodes = load_episodes(root)
    assert [e["episode_index"] for e in episodes] == [0, 1]
    for episode in episodes:
        meta, arrays = load_episode_sidecar(root, episode["episode_index"])
        assert meta is not None and meta["mode"] == "sim" and meta["frames"] == episode["length"]
        assert len(arrays["tick_start"]) == episode["length"] and "initial_state" in arrays
        assert np.all(np.diff(arrays["tick_deadline"]) > 0)
    meta0, _ = load_episode_sidecar(root, 0)
    meta1, _ = load_episode_sidecar(root, 1)
    assert meta0 is not None and meta1 is not None
    assert (
        meta0["seed"] == 3
        and meta0["success_reported"] is True
        and meta0["task"] == "put the cube in the bin"
    )
    assert meta1["seed"] == 5 and meta1["success_reported"] is False
    dataset_meta = load_dataset_sidecar(root)
    assert dataset_meta is not None and dataset_meta["daemon"]["mode"] == "sim" and "units" in dataset_meta
    _lerobot_loads(root, frames=sum(e["length"] for e in episodes))


def test_remote_leader_watchdog_holds_the_follower_and_reports_a_fault(tmp_path: Path, daemons) -> None:
    root = tmp_path / "ds"
    daemon = daemons(sim_config(root, leader="remote"))
    assert daemon.call("status")["leader"]["state"] == "waiting"
    leader = daemon.leader()
    pose = np.array([5.0, -40.0, 40.0, 60.0, 0.0, 20.0], dtype=np.float32)
    pushing = threading.Event()
    pushing.set()
    done = threading.Event()
    # Held from the pusher's check to the end of its send: once the test has cleared `pushing`
    # under it, no pose can follow the garbage, which the conflating socket would then drop unread.
    sending = threading.Lock()

    def push() -> None:
        while not done.is_set():
            with sending:
                if pushing.is_set():
                    leader.send(pose)
            done.wait(0.02)

    pusher = threading.Thread(target=push, daemon=True)
    pusher.start()
    try:
        daemon.wait_status(lambda s: s["leader"]["state"] == "live", what="leader live")
        daemon.call("start_episode", task="remote", seed=1)
        daemon.wait_frames(10)
        with sending:
            pushing.clear()
        leader.send_raw(b"garbage")  # refused and counted (it is the newest message); recording goes on
        status = daemon.wait_status(
            lambda s: any(f["kind"] == "leader_timeout" for f in s["faults"]), what="leader watchdog fault"
        )
        assert status["state"] == "recording"  # holding position does not end the episode
        frames_at_fault = status["episode"]["frames"]
        daemon.wait_frames(frames_at_fault + 10)
        pushing.set()
        daemon.wait_status(lambda s: not s["faults"], what="fault cleared")
        daemon.call("stop_episode")
        daemon.wait_saved(1)
        assert daemon.call("status")["leader"]["rejected"] >= 1
    finally:
        done.set()
        pusher.join(5)
        leader.close()
    assert daemon.shutdown() == 0

    meta, arrays = load_episode_sidecar(root, 0)
    assert meta is not None and any(f["kind"] == "leader_timeout" for f in meta["faults"])
    stale = (arrays["frame_flags"] & int(FrameFlag.LEADER_STALE)) != 0
    assert stale.sum() >= 10
    columns = read_episode(root, 0, columns=["action"])
    actions = columns["action"]
    live = ~stale
    # While live the follower was sent the leader's pose; while stale it held its last goal.
    np.testing.assert_array_equal(actions[live][-1], pose)
    held = actions[stale]
    assert np.all(held == held[0])
    assert np.all(np.isnan(arrays["leader"][stale])) and np.all(arrays["leader"][live] == pose)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_sigterm_and_sigint_save_the_open_episode_and_finalize(tmp_path: Path, daemons, signum: int) -> None:
    root = tmp_path / "ds"
    daemon = daemons(sim_config(root))
    daemon.call("start_episode", task="interrupted", seed=2)
    daemon.wait_frames(10)
    daemon.signal(signum)
    assert daemon.wait_exit() == 0
    check_passes(root)
    episodes = load_episodes(root)
    assert len(episodes) == 1 and episodes[0]["length"] >= 10
    meta, _ = load_episode_sidecar(root, 0)
    assert meta is not None and meta["ended_by"] == f"signal:{signal.Signals(signum).name}"


def test_sigkill_keeps_saved_episodes_and_a_restarted_daemon_carries_on(tmp_path: Path, daemons) -> None:
    root = tmp_path / "ds"
    config = sim_config(root, realtime=False)
    daemon = daemons(config)
    daemon.call("start_episode", task="kept", seed=1)
    daemon.wait_frames(20)
    daemon.call("stop_episode")
    daemon.wait_saved(1)
    saved = load_episode_sidecar(root, 0)[0]
    assert saved is not None
    daemon.call("start_episode", task="lost with the process", seed=2)
    daemon.wait_frames(10)
    daemon.signal(signal.SIGKILL)
    assert daemon.wait_exit() == -signal.SIGKILL

    # The operator's way back: start the daemon again on the same dataset, saying so (--resume).
    # It recovers what the kill interrupted (the open episode was never saved: the only loss).
    again = daemons(config, args=("--resume",))
    assert again.call("status")["dataset"]["episodes"] == 1
    assert again.call("start_episode", task="after the crash", seed=3)["episode_index"] == 1
    again.wait_frames(15)
    again.call("stop_episode")
    again.wait_saved(1)
    assert again.shutdown() == 0
    from hilrec.sim.replay import replay_check

    check_passes(root)
    replay = replay_check(root)
    assert replay.passed, replay.format_text()
    episodes = load_episodes(root)
    assert episodes[0]["length"] == saved["frames"] and len(episodes) == 2


def test_sim_mode_may_run_faster_than_real_time_and_says_so(tmp_path: Path, daemons) -> None:
    root = tmp_path / "ds"
    daemon = daemons(sim_config(root, realtime=False))
    assert daemon.call("status")["loop"]["realtime"] is False
    # Driven with the command-line client this time.
    port = str(daemon.control_port)
    started = run_cli("ctl", "start", "--task", "fast", "--seed", "6", "--port", port)
    assert started.returncode == 0 and json.loads(started.stdout)["seed"] == 6, started.stderr
    daemon.wait_frames(60)
    stopped = run_cli("ctl", "stop", "--failure", "--wait", "--port", port)
    assert stopped.returncode == 0, stopped.stdout + stopped.stderr
    assert json.loads(stopped.stdout)["saved"] is True  # the stop's own result, completed by --wait
    refused = run_cli("ctl", "discard", "--port", port)
    assert refused.returncode == 1 and "no episode is recording" in json.loads(refused.stdout)["error"]
    assert run_cli("ctl", "shutdown", "--port", port).returncode == 0
    assert daemon.wait_exit() == 0
    meta, arrays = load_episode_sidecar(root, 0)
    assert meta is not None
    timing = meta["timing"]
    # Faster than 25 Hz, and the record shows it: real tick starts, not k/fps.
    assert timing["wall_span_s"] < timing["nominal_span_s"]
    assert np.median(np.diff(arrays["tick_start"])) < 0.040


def test_beyond_loopback_only_curve_clients_with_authorized_keys_get_answers(tmp_path: Path, daemons) -> None:
    keys = tmp_path / "keys"
    clients = keys / "clients"
    clients.mkdir(parents=True)
    _, server_secret = zmq.auth.create_certificates(keys, "server")
    _, client_secret = zmq.auth.create_certificates(clients, "operator")
    stranger_dir = tmp_path / "stranger"
    stranger_dir.mkdir()
    _, stranger_secret = zmq.auth.create_certificates(stranger_dir, "stranger")
    curve = f'[zmq.curve]\nserver_secret_key = "{server_secret}"\nauthorized_clients = "{clients}"\n'
    daemon = Daemon(tmp_path, sim_config(tmp_path / "ds"), host="0.0.0.0", zmq_extra=curve)
    try:
        daemon.start(expect_ready=False)
        server_public = keys / "server.key"
        good = ClientKeys.from_files(server_public, Path(client_secret))
        with ControlClient(daemon.control, timeout_ms=1000, retries=60, keys=good) as client:
            assert client.call("status")["ok"]
        for keyset in (None, ClientKeys.from_files(server_public, Path(stranger_secret))):  # none, unknown
            with (
                ControlClient(daemon.control, timeout_ms=500, retries=1, keys=keyset) as client,
                pytest.raises(DaemonUnreachableError),
            ):
                client.request("status")
        with ControlClient(daemon.control, timeout_ms=2000, retries=2, keys=good) as client:
            client.call("shutdown")
        assert daemon.wait_exit() == 0
    finally:
        daemon.close()


def test_ctl_says_at_once_that_no_daemon_is_running_where_nothing_listens() -> None:
    from _daemon import free_ports

    [port] = free_ports(1)
    result = run_cli("ctl", "status", "--port", str(port), "--timeout-ms", "200", "--retries", "2")
    assert (
        result.returncode == 3
        and "no daemon is running" in result.stderr
        and "hilrec daemon" in result.stderr
    )


def _drain(telemetry, limit_s: float = 10.0) -> list[tuple[str, dict, list[bytes]]]:
    out = []
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline and (message := telemetry.receive(100)) is not None:
        out.append(message)
    return out


def _lerobot_loads(root: Path, *, frames: int) -> None:
    """LeRobot opens the dataset and reads its rows. (Its video decoding needs torchcodec or
    torchvision's VideoReader, neither in this environment; ``hilrec check`` decodes the videos.)"""
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    dataset = LeRobotDataset("local/daemon-test", root=root)
    assert dataset.num_frames == frames and dataset.meta.robot_type == "so_follower"
    assert tuple(dataset.meta.features["observation.images.front"]["shape"]) == (48, 64, 3)
    row = dataset.hf_dataset[frames - 1]
    assert int(row["index"]) == frames - 1 and len(row["action"]) == 6
