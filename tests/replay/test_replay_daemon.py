"""A dataset recorded by the daemon itself in emulated mode replays in step with the twin.

This is the format check between the two: the daemon writes what the replay reads (units and the
follower calibration beside the dataset, the leader array and frame flags beside each episode).
The daemon runs as a real ``hilrec daemon`` subprocess on free ports, with its two emulated arms as
child processes, driven over ZeroMQ.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from hilrec.daemon.cli import main
from hilrec.daemon.errors import DaemonUnreachableError
from hilrec.daemon.wire.client import ControlClient

# Real daemons, processes or kill loops: the slow tier (make test runs it; make test-fast does not).
pytestmark = pytest.mark.slow

START_TIMEOUT_S = 90.0


def free_ports(n: int) -> list[int]:
    sockets = [socket.socket() for _ in range(n)]
    for s in sockets:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports


@pytest.fixture
def emulated_daemon(tmp_path: Path) -> Iterator[tuple[ControlClient, Path, subprocess.Popen[bytes]]]:
    root = tmp_path / "dataset"
    control, telemetry, leader = free_ports(3)
    config = tmp_path / "daemon.toml"
    config.write_text(f"""
mode = "emulated"
fps = 25
[dataset]
root = "{root}"
[leader]
source = "serial"
[telemetry]
preview_hz = 0.0
[emulated]
leader_motion = "operator"
[zmq]
host = "127.0.0.1"
control_port = {control}
telemetry_port = {telemetry}
leader_port = {leader}
apply_timeout_ms = 10000
""")
    log = tmp_path / "daemon.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "hilrec.daemon.cli", "daemon", "--config", str(config)],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=dict(os.environ, MUJOCO_GL=os.environ.get("MUJOCO_GL", "egl")),
        )
    client = ControlClient(f"tcp://127.0.0.1:{control}", timeout_ms=1000, retries=1)
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            assert process.poll() is None, f"daemon exited:\n{log.read_text(errors='replace')}"
            try:
                client.request("status")
                break
            except DaemonUnreachableError:
                assert time.monotonic() < deadline, log.read_text(errors="replace")
        client.timeout_ms, client.retries = 5000, 2
        yield client, root, process
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(timeout=30)
        client.close()


def wait_status(
    client: ControlClient, predicate: Callable[[dict[str, Any]], bool], timeout_s: float = 180.0
) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while True:
        status = client.request("status")
        if predicate(status):
            return status
        assert time.monotonic() < deadline, json.dumps(status, indent=1)
        time.sleep(0.05)  # between bounded status requests


def test_daemon_emulated_recording_replays_in_step(emulated_daemon, capsys) -> None:
    client, root, process = emulated_daemon
    assert client.request("start_episode", task="pick the cube", seed=3)["ok"]
    wait_status(client, lambda s: (s.get("episode") or {}).get("frames", 0) >= 75)
    assert client.request("stop_episode", success=True)["ok"]
    wait_status(client, lambda s: s["dataset"]["saved_this_session"] == 1 and s["dataset"]["saving"] == 0)
    assert client.request("shutdown")["ok"]
    assert process.wait(timeout=120) == 0  # the dataset is finalized once the daemon has exited

    capsys.readouterr()  # only what the replay prints from here on
    status = main(["replay", str(root), "--json"])
    out = capsys.readouterr().out
    assert out.startswith("{"), out[:2000]
    doc = json.loads(out)
    [episode] = doc["episodes"]
    # The emulated follower steps its twin a whole frame at a time on its own clock. Depending on
    # where the daemon's ticks fall against that clock, a goal acts on the next frame or, when a
    # frame boundary falls between the follower read and the goal write, on the one after: a
    # clean recording is consistent or lags by up to a frame, and says which.
    why = f"{episode['reason']}; notes {episode['notes']}; flags {episode['recorder_flags']}"
    assert (status, episode["verdict"]) in ((0, "consistent"), (3, "lagging")), why
    assert abs(episode["lag"]["frames"]) <= 1.25, why
    assert doc["units"]["source"] == "dataset metadata (hilrec/dataset.json)"
    # The daemon keeps the leader's reading beside each episode: with no clamp configured the
    # recorded action is the leader reading, frame for frame.
    assert all(j["leader_mismatch_frames"] == 0 for j in episode["joints"].values())
