"""Benchmark of ``hilrec record --sim --workers N`` and ``--ray`` (issue 15, items 2 and 3).

Run: MUJOCO_GL=egl .venv/bin/python bench/bench_fanout.py [--episodes 8] [--repeats 3]
         [--size 320x240] [--no-ray] [--smoke]

Each run is ``hilrec record --sim`` as a user runs it, a process of its own (start-up, imports
and the workers' spawn included), into a new root. Two kinds of episode: no camera (physics and
the operator only) and one front camera at ``--size`` (rendering and AV1 encoding in the
workers). For each, the plain one-process recording (no ``--workers``), ``--workers 1`` (the
fan-out path in one process) and ``--workers 2`` run ``--repeats`` rounds interleaved, so that a
change of load on the machine falls on every variant alike; then, unless ``--no-ray``, a local
Ray cluster (2 CPUs, loopback) is started and ``--ray`` is timed against ``--workers 2`` the same
way. The table gives the median wall time, seconds per episode, the speed-up against the plain
recording, the CPU seconds per episode (of the run and all its processes: what the fan-out costs
beyond the work; Ray's workers are the cluster's processes, not the run's, so for ``--ray`` it is
the driver's alone) and the 1-minute load average around the runs (other work on the machine slows every
variant, and the workers most: the speed-up is only meaningful on a quiet machine).
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HILREC = [sys.executable, "-m", "hilrec.daemon.cli"]
RAY = Path(sys.executable).with_name("ray")


def run_once(root: Path, episodes: int, flags: list[str]) -> tuple[float, float]:
    """(wall seconds, CPU seconds of the run and every process it started)."""
    argv = ["record", "--sim", "--root", str(root), "--episodes", str(episodes), "--no-progress", *flags]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    subprocess.run([*HILREC, *argv], check=True, stdout=subprocess.DEVNULL)
    seconds = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    shutil.rmtree(root)
    return seconds, (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)


Runs = dict[str, list[tuple[float, float]]]


def measure(
    scratch: Path, episodes: int, repeats: int, variants: dict[str, list[str]]
) -> tuple[Runs, tuple[float, float]]:
    times: Runs = {name: [] for name in variants}
    load_before = os.getloadavg()[0]
    for _ in range(repeats):
        for name, flags in variants.items():
            times[name].append(run_once(scratch / "ds", episodes, flags))
    return times, (load_before, os.getloadavg()[0])


def median_wall(runs: list[tuple[float, float]]) -> float:
    return statistics.median(wall for wall, _cpu in runs)


def report(title: str, episodes: int, times: Runs, load: tuple[float, float]) -> None:
    base = median_wall(next(iter(times.values())))
    print(f"\n{title} ({episodes} episodes; load average {load[0]:.1f} -> {load[1]:.1f})")
    print(f"{'variant':<22} {'median s':>9} {'s/episode':>10} {'speed-up':>9} {'CPU s/ep':>9}  runs (wall)")
    for name, runs in times.items():
        median = median_wall(runs)
        cpu = statistics.median(c for _wall, c in runs) / episodes
        walls = " ".join(f"{wall:.1f}" for wall, _cpu in runs)
        print(f"{name:<22} {median:9.2f} {median / episodes:10.3f} {base / median:8.2f}x {cpu:9.3f}  {walls}")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def start_ray(temp: Path) -> tuple[str, int]:
    """A 2-CPU head on loopback in a process group of its own; (address, its process group)."""
    port = free_port()
    argv = [str(RAY), "start", "--head", "--node-ip-address=127.0.0.1", f"--port={port}", "--num-cpus=2"]
    argv += ["--include-dashboard=false", "--disable-usage-stats", f"--temp-dir={temp}"]
    for flag in ("ray-client-server-port", "dashboard-port", "dashboard-agent-listen-port"):
        argv.append(f"--{flag}={free_port()}")
    # Without this switch Ray replaces the loopback node address by the host's own.
    os.environ.update(RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0", RAY_USAGE_STATS_ENABLED="0")
    env = dict(os.environ)
    subprocess.run(argv, env=env, check=True, capture_output=True, start_new_session=True)
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if str(temp).encode() in (entry / "cmdline").read_bytes():
                    return f"127.0.0.1:{port}", os.getpgid(int(entry.name))
            except OSError:
                continue
    raise SystemExit("ray start left no process behind")


def stop_group(pgid: int) -> None:
    """SIGTERM the group, SIGKILL what is left after 5 s (never `ray stop`: it stops every
    cluster of the user on this machine)."""
    deadline = time.monotonic() + 5.0
    while True:
        try:
            os.killpg(pgid, signal.SIGTERM if time.monotonic() < deadline else signal.SIGKILL)
        except ProcessLookupError:
            return
        time.sleep(0.2)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--size", default="320x240", help="camera WxH (default 320x240)")
    parser.add_argument("--no-ray", dest="ray", action="store_false", help="skip the Ray comparison")
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="2 episodes at 64x48 with a camera, one round, no Ray (~20 s to start)",
    )
    args = parser.parse_args()
    if args.smoke:
        args.episodes, args.repeats, args.size, args.ray = 2, 1, "64x48", False
    os.environ.setdefault("MUJOCO_GL", "egl")
    os.environ.setdefault("PYOPENGL_PLATFORM", "egl")
    print(f"cores {os.cpu_count()}, python {sys.version.split()[0]}")
    with tempfile.TemporaryDirectory(prefix="bench-fanout-") as tmp:
        scratch = Path(tmp)
        kinds = {
            "no camera": ["--cameras", "none"],
            f"front camera {args.size}": ["--cameras", "front", "--size", args.size],
        }
        if args.smoke:  # the camera kind runs every step the other does, and more
            del kinds["no camera"]
        for title, kind in kinds.items():
            variants = {
                "one process": kind,
                "--workers 1": [*kind, "--workers", "1"],
                "--workers 2": [*kind, "--workers", "2"],
            }
            times, load = measure(scratch, args.episodes, args.repeats, variants)
            report(title, args.episodes, times, load)
        if not args.ray:
            return
        ray_temp = Path(tempfile.mkdtemp(prefix="bench-ray-", dir="/tmp"))
        address, pgid = start_ray(ray_temp)
        try:
            kind = ["--cameras", "none"]
            variants = {"--workers 2": [*kind, "--workers", "2"], "--ray (2 CPUs)": [*kind, "--ray", address]}
            times, load = measure(scratch, args.episodes, args.repeats, variants)
            report("Ray against the process pool, no camera", args.episodes, times, load)
            extra = median_wall(times["--ray (2 CPUs)"]) - median_wall(times["--workers 2"])
            print(f"Ray overhead: {extra / args.episodes:+.3f} s per episode ({extra:+.1f} s per run)")
        finally:
            stop_group(pgid)
            shutil.rmtree(ray_temp, ignore_errors=True)


if __name__ == "__main__":
    main()
