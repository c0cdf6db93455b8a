"""Benchmark of ``--workers`` on ``hilrec replay`` and ``hilrec check --replay`` (issue 15, item 2).

Run: MUJOCO_GL=egl .venv/bin/python bench/bench_replay_workers.py [--sim-episodes 16]
         [--hardware-episodes 16] [--frames 250] [--repeats 3] [--workers 1 2] [--smoke]

Two datasets are made first: a sim dataset (``hilrec record --sim``, no cameras, with pushes, so
the bit-exact replay also replays each episode without them) and a hardware-like one (the replay
tests' recorder: a twin follower behind a leader of random waypoints, hilrec's native writer).
Then each command runs as a user runs it, a ``hilrec`` process of its own (start-up and imports
included), for every worker count in turn, ``--repeats`` rounds interleaved so that a change of
load on the machine falls on every count alike. The table gives the median wall time, episodes/s,
the speed-up against the first count and the 1-minute load average around the runs. Every run's
report must equal the first count's (the run's wall time left out), or the benchmark fails.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

# The hardware-like recorder lives with the replay tests; the benchmark reuses it.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "replay"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # support, which it imports

from _recordings import RecordingSpec, make_twin, record, write_native

HILREC = [sys.executable, "-m", "hilrec.daemon.cli"]


def build_sim(root: Path, episodes: int) -> Path:
    argv = ["record", "--sim", "--root", str(root), "--episodes", str(episodes), "--seed", "100"]
    subprocess.run([*HILREC, *argv, "--cameras", "none", "--pushes", "1.5", "--no-progress"], check=True)
    return root


def build_hardware(root: Path, episodes: int, frames: int) -> Path:
    twin = make_twin()
    recorded = [
        record(RecordingSpec(seed=seed, frames=frames, latency_frames=seed % 3), twin)
        for seed in range(episodes)
    ]
    return write_native(root, recorded, twin)


def comparable(stdout: str) -> Any:
    """The report with the run's wall time taken out (``hilrec replay --json`` says it)."""
    document = json.loads(stdout)
    document.pop("seconds", None)
    return document


def run_once(argv: list[str]) -> tuple[float, int, Any]:
    started = time.perf_counter()
    done = subprocess.run([*HILREC, *argv], capture_output=True, text=True, check=False)
    wall = time.perf_counter() - started
    if done.returncode not in (0, 1, 3, 4):
        raise SystemExit(f"hilrec {' '.join(argv)} failed ({done.returncode}):\n{done.stderr}")
    return wall, done.returncode, comparable(done.stdout)


def measure(
    name: str, argv: list[str], counts: list[int], repeats: int, episodes: int
) -> list[dict[str, Any]]:
    walls: dict[int, list[float]] = {n: [] for n in counts}
    loads: list[float] = [os.getloadavg()[0]]
    reference: Any = None
    for _ in range(repeats):
        for n in counts:
            wall, code, report = run_once([*argv, "--workers", str(n)])
            if reference is None:
                reference = (code, report)
            elif (code, report) != reference:
                raise SystemExit(f"{name}: the report with --workers {n} differs from --workers {counts[0]}")
            walls[n].append(wall)
            loads.append(os.getloadavg()[0])
    base = statistics.median(walls[counts[0]])
    rows = []
    for n in counts:
        median = statistics.median(walls[n])
        rows.append(
            {
                "command": name,
                "workers": n,
                "median_s": median,
                "runs_s": walls[n],
                "episodes_per_s": episodes / median,
                "speedup": base / median,
                "load": (min(loads), max(loads)),
                "exit_status": reference[0],
            }
        )
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sim-episodes", type=int, default=16)
    parser.add_argument("--hardware-episodes", type=int, default=16)
    parser.add_argument(
        "--frames", type=int, default=1500, help="frames per hardware-like episode (60 s at 25 fps)"
    )
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--smoke", action="store_true", help="2 + 2 episodes (50 frames), one round")
    args = parser.parse_args()
    if args.smoke:
        args.sim_episodes, args.hardware_episodes, args.frames, args.repeats = 2, 2, 50, 1

    with tempfile.TemporaryDirectory(prefix="bench-replay-workers-") as tmp:
        work = Path(tmp)
        t0 = time.perf_counter()
        sim = build_sim(work / "sim", args.sim_episodes)
        hardware = build_hardware(work / "hardware", args.hardware_episodes, args.frames)
        print(f"datasets made in {time.perf_counter() - t0:.1f} s; {os.cpu_count()} cores")
        runs = [
            ("replay (hardware)", ["replay", str(hardware), "--json"], args.hardware_episodes),
            (
                "check --replay (hardware)",
                ["check", str(hardware), "--replay", "--json"],
                args.hardware_episodes,
            ),
            ("check --replay (sim)", ["check", str(sim), "--replay", "--json"], args.sim_episodes),
        ]
        rows = [row for name, argv, n in runs for row in measure(name, argv, args.workers, args.repeats, n)]

    print()
    print(
        f"{args.hardware_episodes} hardware-like episodes of {args.frames} frames; {args.sim_episodes} sim "
        f"episodes (pushes, replayed with and without them); {args.repeats} interleaved rounds"
    )
    print("| command | --workers | wall s (median) | runs | episodes/s | speed-up | load avg 1 min |")
    print("|---|---:|---:|---|---:|---:|---|")
    for r in rows:
        runs_s = ", ".join(f"{w:.2f}" for w in r["runs_s"])
        print(
            f"| {r['command']} | {r['workers']} | {r['median_s']:.2f} | {runs_s} | "
            f"{r['episodes_per_s']:.1f} | {r['speedup']:.2f}x | {r['load'][0]:.2f}-{r['load'][1]:.2f} |"
        )
    print("reports identical for every worker count: yes")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
