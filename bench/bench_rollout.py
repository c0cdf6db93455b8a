"""Rollout benchmark: a tiny LeRobot ACT drives the emulated follower through the daemon's loop.

A tiny ACT (LeRobot 0.4.4, trained a few steps on synthetic frames, :mod:`tiny_act`) is saved as
a pretrained directory in a temporary folder and given to ``hilrec daemon`` in emulated mode as
``[policy] spec`` (``takeover = "off"``), with one 48x64 twin camera, at each ``--fps`` (default
25 and 30). One take of ``--duration`` seconds (default 20) is recorded per rate, driven over
ZeroMQ only. Reported, from the take's own per-tick record (hilrec/episodes/*.npz and .json):

- ticks missed: slots with no tick at all (``tick_skipped``) plus ticks that ran past the next
  deadline (``OVERRUN``): the loop's own timing, which inference must not disturb;
- starved ticks: the policy drove and no goal was due (the follower held its last goal);
- inference latency p50/p99: the policy's own inference time per chunk (measured in its process);
- action age p50/max: ticks from the observation a goal came from to the tick that sent it.

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
from pathlib import Path
from typing import Any

import numpy as np

os.environ.setdefault("MUJOCO_GL", "egl")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _takes import stop_take
from tiny_act import train_tiny_act

from hilrec.daemon.dataset import FrameFlag
from hilrec.daemon.errors import DaemonUnreachableError
from hilrec.daemon.wire.client import ControlClient

START_TIMEOUT_S = 300.0


def free_ports(n: int) -> list[int]:
    sockets = [socket.socket() for _ in range(n)]
    for s in sockets:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports


def config_text(root: Path, act: Path, fps: int, ports: list[int]) -> str:
    return f"""
mode = "emulated"
fps = {fps}
[dataset]
root = "{root}"
[leader]
source = "serial"
[telemetry]
preview_hz = 0.0
[emulated]
leader_motion = "operator"
[cameras.front]
source = "twin"
height = 48
width = 64
fps = {fps}
stall_ms = 2000
[policy]
spec = "{act}"
takeover = "off"
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


def run_take(workdir: Path, act: Path, fps: int, duration: float) -> dict[str, Any]:
    root = workdir / f"ds-{fps}"
    ports = free_ports(3)
    config = workdir / f"daemon-{fps}.toml"
    config.write_text(config_text(root, act, fps, ports))
    log = (workdir / f"daemon-{fps}.log").open("wb")
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
                raise RuntimeError(f"daemon exited: {(workdir / f'daemon-{fps}.log').read_text()[-2000:]}")
            try:
                request(client, "status")
                break
            except DaemonUnreachableError:
                if time.monotonic() > deadline:
                    raise
        request(client, "start_episode", task="tiny act")
        time.sleep(duration)  # the take's length is the measurement's duration, not a wait for a state
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
    return {**summarize(root, fps), "ended_by": ended_by}


def summarize(root: Path, fps: int) -> dict[str, Any]:
    from hilrec.daemon.dataset.format.sidecar import load_episode_sidecar

    sidecar, arrays = load_episode_sidecar(root, 0)
    assert sidecar is not None
    flags = arrays["frame_flags"]
    ages = arrays["action_age_ticks"]
    used = ages[ages >= 0]
    latency = sidecar["rollout"]["inference_latency_s"]
    return {
        "fps": fps,
        "frames": len(flags),
        "skipped": int(arrays["tick_skipped"].sum()),
        "overruns": int(np.count_nonzero(flags & int(FrameFlag.OVERRUN))),
        "starved": int(np.count_nonzero(flags & int(FrameFlag.STARVED))),
        "chunks": latency["chunks"],
        "p50_ms": (latency["p50"] or float("nan")) * 1e3,
        "p99_ms": (latency["p99"] or float("nan")) * 1e3,
        "age_p50": float(np.percentile(used, 50)) if used.size else float("nan"),
        "age_max": int(used.max()) if used.size else -1,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fps", type=int, nargs="+", default=[25, 30])
    parser.add_argument("--duration", type=float, default=20.0, help="seconds per take (default 20)")
    parser.add_argument("--smoke", action="store_true", help="one 3 s take at 25 fps (make bench-smoke)")
    args = parser.parse_args(argv)
    if args.smoke:
        args.fps, args.duration = [25], 3.0
    with tempfile.TemporaryDirectory(prefix="hilrec-bench-rollout-") as tmp:
        workdir = Path(tmp)
        act = train_tiny_act(workdir / "act")
        rows = [run_take(workdir, act, fps, args.duration) for fps in args.fps]
    print(f"# bench_rollout: tiny ACT (chunk 10) drives the emulated follower, {args.duration:.0f} s takes")
    print(f"# load average {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f} on {os.cpu_count()} cores")
    print(
        "| fps | frames | ticks missed (skipped + overrun) | starved ticks | chunks "
        "| latency p50 / p99 ms | action age p50 / max (ticks) | take ended by |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['fps']} | {r['frames']} "
            f"| {r['skipped'] + r['overruns']} ({r['skipped']} + {r['overruns']}) "
            f"| {r['starved']} | {r['chunks']} | {r['p50_ms']:.1f} / {r['p99_ms']:.1f} "
            f"| {r['age_p50']:.0f} / {r['age_max']} | {r['ended_by']} |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
