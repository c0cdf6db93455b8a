"""One teleop cycle over two emulated arms with wire timing at 1 Mbps: ours vs LeRobot's.

A cycle is what the daemon does per tick on the bus: read the leader (SYNC_READ of
Present_Position, 6 servos), read the follower (same), write the follower (SYNC_WRITE of
Goal_Position). Both emulators run in their own processes (``hilrec emulate --wire-timing``), so
the client's CPU time is its own. Compared side by side on the same two ports:

- hilrec: SO101Leader.read, SO101Follower.read, SO101Follower.send_action (our bus: exclusive
  port, input flushed before each transaction, waits in select() with a 1 ms slice);
- hilrec, SDK waiting: the same with the two guards off (no flush, timeout=0 busy-polling as
  the SDK does), to show what they cost or save;
- LeRobot 0.4.4: SOLeader/SOFollower connected and configured, cycling their buses' normalised
  sync_read (with 2 retries, as ours) and sync_write: what get_action, get_observation and
  send_action do, without the dict renaming.

Wire time alone for a cycle is 2 x (14 + 6 x 8) + (8 + 6 x 3) = 150 bytes = 1.50 ms at 10 us a
byte; a client never waits for the SYNC_WRITE, so about 1.24 ms of it is on the critical path.
On real hardware a 6-servo sync read takes about 1 ms (USB adds frame latency).

Usage: python bench/bench_bus.py [--cycles 1000] [--no-lerobot] [--smoke]
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from hilrec.drivers import arm as hilrec_arm
from hilrec.drivers.bus import FeetechBus

WIRE_CRITICAL_MS = 2 * (14 + 6 * 8) * 0.01


def start_emulator(role: str, motion: str, calibration: Path) -> tuple[subprocess.Popen, str]:
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "hilrec.daemon.cli",
            "emulate",
            role,
            "--wire-timing",
            "--motion",
            motion,
            "--write-calibration",
            str(calibration),
        ],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    assert process.stdout is not None  # stdout=PIPE
    port = process.stdout.readline().strip()
    if not port.startswith("/dev/"):
        process.kill()
        raise SystemExit(f"emulated {role} did not start: {port!r}")
    return process, port


def process_cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def measure(cycle: Callable[[], None], cycles: int, emulator_pids: list[int]) -> dict[str, float]:
    for _ in range(50):  # warm-up: caches, first-time allocations
        cycle()
    wall, cpu = [], []
    emu_before = sum(process_cpu_s(pid) for pid in emulator_pids)
    for _ in range(cycles):
        w0, c0 = time.perf_counter(), time.thread_time()
        cycle()
        cpu.append(time.thread_time() - c0)
        wall.append(time.perf_counter() - w0)
    emu_cpu = sum(process_cpu_s(pid) for pid in emulator_pids) - emu_before
    wall_ms = np.array(wall) * 1e3
    return {
        "p50": float(np.percentile(wall_ms, 50)),
        "p99": float(np.percentile(wall_ms, 99)),
        "max": float(wall_ms.max()),
        "cpu": statistics.fmean(cpu) * 1e3,
        "cpu_share": sum(cpu) / sum(wall),
        "emu_cpu": emu_cpu / cycles * 1e3,
    }


def hilrec_cycle(
    leader_port: str, follower_port: str, calibration: Path, *, guards: bool
) -> tuple[Callable[[], None], Callable[[], None]]:
    leader = hilrec_arm.SO101Leader(hilrec_arm.ArmConfig(port=leader_port, calibration=calibration))
    follower = hilrec_arm.SO101Follower(
        hilrec_arm.FollowerConfig(port=follower_port, calibration=calibration)
    )
    if not guards:
        for arm in (leader, follower):
            arm.bus = FeetechBus(dataclasses.replace(arm.bus.config, flush_input=False, wait_slice_s=0.0))
    leader.open()
    follower.open()

    def cycle() -> None:
        action = leader.read().values
        follower.read()
        follower.send_action(action)

    def close() -> None:
        follower.close()
        leader.close()

    return cycle, close


def lerobot_cycle(
    leader_port: str, follower_port: str, calibration: Path, workdir: Path
) -> tuple[Callable[[], None], Callable[[], None]]:
    from lerobot.robots.so_follower import SOFollower, SOFollowerRobotConfig
    from lerobot.teleoperators.so_leader import SOLeader, SOLeaderTeleopConfig

    for kind in ("leader", "follower"):
        (workdir / kind).mkdir(exist_ok=True)
        (workdir / kind / "bench.json").write_bytes(calibration.read_bytes())
    leader = SOLeader(SOLeaderTeleopConfig(port=leader_port, id="bench", calibration_dir=workdir / "leader"))
    follower = SOFollower(
        SOFollowerRobotConfig(port=follower_port, id="bench", calibration_dir=workdir / "follower")
    )
    leader.connect(calibrate=False)
    follower.connect(calibrate=False)

    def cycle() -> None:
        # get_action / get_observation / send_action minus their dict building, with the same
        # 2 read retries as ours (0.4.4's SO classes retry none: one late reply kills the loop).
        action = leader.bus.sync_read("Present_Position", num_retry=2)
        follower.bus.sync_read("Present_Position", num_retry=2)
        follower.bus.sync_write("Goal_Position", action)

    def close() -> None:
        follower.disconnect()
        leader.disconnect()

    return cycle, close


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cycles", type=int, default=1000)
    parser.add_argument("--no-lerobot", action="store_true")
    parser.add_argument("--smoke", action="store_true", help="20 cycles; a failed client fails the run")
    args = parser.parse_args()
    if args.smoke:
        args.cycles = 20
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        calibration = workdir / "so101.json"
        leader_proc, leader_port = start_emulator("leader", "wave", calibration)
        follower_proc, follower_port = start_emulator("follower", "servo", calibration)
        pids = [leader_proc.pid, follower_proc.pid]
        rows: list[tuple[str, dict[str, Any]]] = []  # a run's measures, or why it failed
        try:
            runs = [
                (
                    "hilrec (flush + select wait)",
                    lambda: hilrec_cycle(leader_port, follower_port, calibration, guards=True),
                ),
                (
                    "hilrec, SDK waiting (no flush, spin)",
                    lambda: hilrec_cycle(leader_port, follower_port, calibration, guards=False),
                ),
            ]
            if not args.no_lerobot:
                runs.append(
                    (
                        "LeRobot 0.4.4 FeetechMotorsBus",
                        lambda: lerobot_cycle(leader_port, follower_port, calibration, workdir),
                    )
                )
            for name, build in runs:
                print(f"running: {name}", file=sys.stderr, flush=True)
                cycle, close = build()
                try:
                    rows.append((name, measure(cycle, args.cycles, pids)))
                except Exception as exc:  # a failed client is a result too (not in a smoke run)
                    if args.smoke:
                        raise
                    print(f"  failed: {type(exc).__name__}: {exc}", file=sys.stderr)
                    rows.append((name, {"failed": str(exc)}))
                finally:
                    close()
        finally:
            for proc in (leader_proc, follower_proc):
                proc.terminate()
                proc.wait(timeout=10)
    load = os.getloadavg()[0]
    print(
        f"\nteleop cycle (leader sync read + follower sync read + follower sync write), "
        f"{args.cycles} cycles, 2 emulators with wire timing at 1 Mbps, "
        f"wire-time floor {WIRE_CRITICAL_MS:.2f} ms; {os.cpu_count()} CPUs, load average "
        f"{load:.1f}\n"
    )
    header = (
        f"{'client':<38} {'p50 ms':>7} {'p99 ms':>7} {'max ms':>7} {'CPU ms/cycle':>13} "
        f"{'CPU/wall':>9} {'emulators CPU ms':>17}"
    )
    print(header)
    print("-" * len(header))
    for name, r in rows:
        if "failed" in r:
            print(f"{name:<38} failed: {r['failed']}")
            continue
        print(
            f"{name:<38} {r['p50']:>7.2f} {r['p99']:>7.2f} {r['max']:>7.2f} {r['cpu']:>13.3f} "
            f"{r['cpu_share']:>8.0%} {r['emu_cpu']:>17.3f}"
        )
    base = rows[0][1]
    for name, r in rows[1:]:
        if "failed" in r or "failed" in base:
            continue
        print(
            f"\n{name} / hilrec: p50 x{r['p50'] / base['p50']:.2f}, "
            f"CPU per cycle x{r['cpu'] / base['cpu']:.2f}"
        )


if __name__ == "__main__":
    main()
