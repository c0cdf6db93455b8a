"""Leader-follow benchmark: what the leader following the follower under torque costs the tick.

``hilrec daemon`` in emulated mode (wire timing on, the scripted hand resting on the leader) with
a scripted policy swaying the shoulder pan (:class:`Sway`, this file, given as ``[policy] spec``)
records one take of ``--duration`` seconds (default 10) with ``[policy] leader_follow`` on, and
one with it off. Reported, from each take's own per-tick record (hilrec/episodes/*.npz) and the
daemon's status:

- the leader phase per tick (from the observation's end to the leader's reading: the leader's
  read, the policy's feed and, when following, the leader's Goal_Position write), p50/p99 ms;
- the tick's bus time (follower and leader), p50/p99 ms;
- the feedback write alone (``leader_follow.feedback_ms`` in status), p50/max ms;
- the takeover gap: during each take the person takes over through ``takeover`` every
  ``--switch-every`` seconds and hands back half-way to the next; the gap is the largest joint's
  distance between the first human goal and the follower's measured pose on that row, p50/max
  degrees, and how many takeovers were over half a clamp step (3 degrees at the tests'
  ``max_relative_target`` of 6). Following keeps it to the sway's motion over a tick or two;
  without following it is wherever the hand left the leader.

The on-take runs twice, the second time beside busy loops on all cores but one (ordinary load, at
the default nice): late ticks widen the gap, which is why tests/policy/test_leader_follow.py
bounds it by one clamp step and this benchmark reports how wide it gets. The machine's load
average is printed: on a shared 2-core machine the numbers depend on it.
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
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import numpy as np

os.environ.setdefault("MUJOCO_GL", "egl")
# The busy loops the tests' LeRobot harness uses (tests/drivers/_teleoperate.py).
TESTS = Path(__file__).resolve().parents[1] / "tests"
# The daemon loads this file as the policy module, with neither folder on its path.
sys.path[:0] = [str(TESTS), str(TESTS / "drivers"), str(Path(__file__).resolve().parent)]

from _takes import stop_take  # noqa: E402
from _teleoperate import cpu_load  # noqa: E402

from hilrec.daemon.errors import DaemonUnreachableError  # noqa: E402
from hilrec.daemon.wire.client import ControlClient  # noqa: E402

START_TIMEOUT_S = 300.0
HALF_CLAMP_DEG = 3.0  # half of tests/policy/test_leader_follow.py's max_relative_target


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


def run_take(
    workdir: Path, follow: bool, duration: float, switch_every: float, loaded: bool
) -> dict[str, Any]:
    name = ("on" if follow else "off") + (" + busy loops" if loaded else "")
    label = ("on" if follow else "off") + ("-loaded" if loaded else "")  # in file names
    root, ports = workdir / f"ds-{label}", free_ports(3)
    config = workdir / f"daemon-{label}.toml"
    config.write_text(config_text(root, follow, ports))
    log = (workdir / f"daemon-{label}.log").open("wb")
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
                raise RuntimeError(f"daemon exited: {(workdir / f'daemon-{label}.log').read_text()[-2000:]}")
            try:
                request(client, "status")
                break
            except DaemonUnreachableError:
                if time.monotonic() > deadline:
                    raise
        with cpu_load() if loaded else nullcontext(0):
            request(client, "start_episode", task="sway")
            switch_hands(client, duration, switch_every)
            following = request(client, "status")["leader"]["leader_follow"]
        ended_by = stop_take(client).ended_by
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
    return summarize(root, name, following) | {"ended_by": ended_by}


def switch_hands(client: ControlClient, duration: float, every: float) -> None:
    """Take over every ``every`` seconds and hand back half-way, for the take's ``duration``:
    the take's length is the measurement's duration, not a wait for a state."""
    started = time.monotonic()
    switch = 1
    while (due := started + switch * every / 2) < started + duration:
        time.sleep(max(0.0, due - time.monotonic()))
        request(client, "takeover" if switch % 2 else "handback")
        switch += 1
    time.sleep(max(0.0, started + duration - time.monotonic()))
    if switch % 2 == 0:  # the person has it: the take ends under the policy, as it began
        request(client, "handback")


def takeover_gaps(root: Path) -> np.ndarray:
    """Per takeover: the largest joint's distance from the first human goal to the measured pose."""
    from hilrec.daemon.dataset.format.reader import read_episode

    rows = read_episode(root, 0, ["intervention", "action", "observation.state"])
    human = rows["intervention"].reshape(-1).astype(np.int8)
    takeovers = np.flatnonzero(np.diff(human) == 1) + 1
    gap = np.abs(rows["action"].astype(np.float64) - rows["observation.state"].astype(np.float64))
    return gap[takeovers].max(axis=1) if len(takeovers) else np.zeros(0)


def summarize(root: Path, name: str, following: dict[str, Any] | None) -> dict[str, Any]:
    from hilrec.daemon.dataset.format.sidecar import load_episode_sidecar

    _, arrays = load_episode_sidecar(root, 0)
    leader = (np.asarray(arrays["tick_leader_read"]) - np.asarray(arrays["tick_observed"])) * 1e3
    bus = np.asarray(arrays["tick_bus_s"]) * 1e3
    feedback = (following or {}).get("feedback_ms") or {}
    gaps = takeover_gaps(root)
    return {
        "gaps": gaps,
        "follow": name,
        "frames": len(bus),
        "leader": (float(np.percentile(leader, 50)), float(np.percentile(leader, 99))),
        "bus": (float(np.percentile(bus, 50)), float(np.percentile(bus, 99))),
        "feedback": (feedback.get("p50"), feedback.get("max")),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=float, default=10.0, help="seconds per take (default 10)")
    parser.add_argument(
        "--switch-every", type=float, default=1.0, help="seconds from one takeover to the next (default 1)"
    )
    parser.add_argument("--smoke", action="store_true", help="3 s takes, no busy loops")
    args = parser.parse_args(argv)
    takes = [(True, False), (True, True), (False, False)]
    if args.smoke:
        args.duration = 3.0
        takes = [(True, False), (False, False)]
    with tempfile.TemporaryDirectory(prefix="hilrec-bench-follow-") as tmp:
        rows = [
            run_take(Path(tmp), follow, args.duration, switch_every=args.switch_every, loaded=loaded)
            for follow, loaded in takes
        ]
    print(f"# bench_leader_follow: a swaying policy, emulated arms at 1 Mbps, {args.duration:.0f} s takes")
    print(f"# load average {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f} on {os.cpu_count()} cores")
    print(
        "| leader_follow | frames | leader phase p50 / p99 ms | bus p50 / p99 ms "
        f"| feedback write p50 / max ms | takeovers | gap p50 / max deg | gaps > {HALF_CLAMP_DEG:.0f} deg "
        "| take ended by |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        fb, gaps = r["feedback"], r["gaps"]
        feedback = "-" if fb[0] is None else f"{fb[0]:.2f} / {fb[1]:.1f}"
        gap = "-" if not len(gaps) else f"{np.median(gaps):.2f} / {gaps.max():.2f}"
        print(
            f"| {r['follow']} | {r['frames']} | {r['leader'][0]:.2f} / {r['leader'][1]:.1f} "
            f"| {r['bus'][0]:.2f} / {r['bus'][1]:.1f} | {feedback} | {len(gaps)} | {gap} "
            f"| {int((gaps > HALF_CLAMP_DEG).sum())} | {r['ended_by']} |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
