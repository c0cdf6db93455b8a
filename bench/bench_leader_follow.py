"""Leader-follow benchmark: what the leader following the follower under torque costs the tick.

``hilrec daemon`` in emulated mode (wire timing on, the scripted hand resting on the leader) with
a scripted policy swaying the shoulder pan (:class:`Sway`, this file, given as ``[policy] spec``)
records one take of ``--duration`` seconds (default 10) with ``[policy] leader_follow`` on, and
one with it off. Reported, from each take's own per-tick record (hilrec/episodes/*.npz) and the
daemon's status:

- the leader phase per tick (from the observation's end to the leader's reading: the leader's
  read, the policy's feed and, when following, the leader's Goal_Position write), p50/p99 ms;
- the tick's bus time (follower and leader), p50/p99 ms;
- the feedback write alone (``leader_follow.feedback_ms`` in status), p50/max ms.

The machine's load average is printed: on a shared 2-core machine the numbers depend on it.
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

os.environ.setdefault("MUJOCO_GL", "egl")

from hilrec.daemon.errors import DaemonUnreachableError
from hilrec.daemon.wire.client import ControlClient

START_TIMEOUT_S = 300.0


class Sway:
    """Chunks of ten goals swinging the shoulder pan +-10 degrees around where the arm started."""

    def __init__(self) -> None:
        self.start: np.ndarray | None = None
        self.calls = 0

    def reset(self) -> None:
        self.start = None

    def __call__(self, observation: Mapping[str, Any]) -> np.ndarray:
        state = np.asarray(observation["observation.state"], dtype=np.float32)
        if self.start is None:
            self.start = state.copy()
        self.calls += 1
        chunk = np.repeat(self.start[None, :], 10, axis=0)
        chunk[:, 0] += np.float32(10.0 * np.sin(self.calls / 5.0))
        return chunk


def free_ports(n: int) -> list[int]:
    sockets = [socket.socket() for _ in range(n)]
    for s in sockets:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports


def config_text(root: Path, follow: bool, ports: list[int]) -> str:
    return f"""
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
leader_hand = "rest"
[policy]
spec = "{Path(__file__).resolve()}:Sway"
takeover = "key"
leader_follow = {"true" if follow else "false"}
[zmq]
control_port = {ports[0]}
telemetry_port = {ports[1]}
leader_port = {ports[2]}
apply_timeout_ms = 10000
"""


def request(client: ControlClient, cmd: str, **args: Any) -> dict[str, Any]:
    reply = client.request(cmd, **args)
    if not reply.get("ok"):
        raise RuntimeError(f"{cmd} refused: {reply}")
    return reply


def run_take(workdir: Path, follow: bool, duration: float) -> dict[str, Any]:
    name = "on" if follow else "off"
    root, ports = workdir / f"ds-{name}", free_ports(3)
    config = workdir / f"daemon-{name}.toml"
    config.write_text(config_text(root, follow, ports))
    log = (workdir / f"daemon-{name}.log").open("wb")
    process = subprocess.Popen(
        [sys.executable, "-m", "hilrec.daemon.cli", "daemon", "--config", str(config), "--no-display"],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    client = ControlClient(f"tcp://127.0.0.1:{ports[0]}", timeout_ms=2000, retries=1)
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"daemon exited: {(workdir / f'daemon-{name}.log').read_text()[-2000:]}")
            try:
                request(client, "status")
                break
            except DaemonUnreachableError:
                if time.monotonic() > deadline:
                    raise
        request(client, "start_episode", task="sway")
        time.sleep(duration)  # the take's length is the measurement's duration, not a wait for a state
        following = request(client, "status")["leader"]["leader_follow"]
        request(client, "stop_episode")
        while True:
            status = request(client, "status")
            if status["dataset"]["saved_this_session"] >= 1 and status["dataset"]["saving"] == 0:
                break
            time.sleep(0.1)
        request(client, "shutdown")
        process.wait(120)
    finally:
        client.close()
        if process.poll() is None:
            process.kill()
            process.wait(10)
        log.close()
    return summarize(root, name, following)


def summarize(root: Path, name: str, following: dict[str, Any] | None) -> dict[str, Any]:
    from hilrec.daemon.dataset.format.sidecar import load_episode_sidecar

    _, arrays = load_episode_sidecar(root, 0)
    leader = (np.asarray(arrays["tick_leader_read"]) - np.asarray(arrays["tick_observed"])) * 1e3
    bus = np.asarray(arrays["tick_bus_s"]) * 1e3
    feedback = (following or {}).get("feedback_ms") or {}
    return {
        "follow": name,
        "frames": len(bus),
        "leader": (float(np.percentile(leader, 50)), float(np.percentile(leader, 99))),
        "bus": (float(np.percentile(bus, 50)), float(np.percentile(bus, 99))),
        "feedback": (feedback.get("p50"), feedback.get("max")),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=float, default=10.0, help="seconds per take (default 10)")
    parser.add_argument("--smoke", action="store_true", help="3 s takes")
    args = parser.parse_args(argv)
    if args.smoke:
        args.duration = 3.0
    with tempfile.TemporaryDirectory(prefix="hilrec-bench-follow-") as tmp:
        rows = [run_take(Path(tmp), follow, args.duration) for follow in (True, False)]
    print(f"# bench_leader_follow: a swaying policy, emulated arms at 1 Mbps, {args.duration:.0f} s takes")
    print(f"# load average {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f} on {os.cpu_count()} cores")
    print(
        "| leader_follow | frames | leader phase p50 / p99 ms | bus p50 / p99 ms "
        "| feedback write p50 / max ms |"
    )
    print("|---|---|---|---|---|")
    for r in rows:
        fb = r["feedback"]
        feedback = "-" if fb[0] is None else f"{fb[0]:.2f} / {fb[1]:.1f}"
        print(
            f"| {r['follow']} | {r['frames']} | {r['leader'][0]:.2f} / {r['leader'][1]:.1f} "
            f"| {r['bus'][0]:.2f} / {r['bus'][1]:.1f} | {feedback} |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
