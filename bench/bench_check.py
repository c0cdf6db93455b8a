"""Benchmark of `hilrec check`: frames checked per second, serial against parallel decoding.

Run: MUJOCO_GL=egl .venv/bin/python bench/bench_check.py [--root DIR] [--episodes 20]
         [--size 320x240] [--repeats 3] [--doctor-path DIR] [--smoke]

A 20-episode sim dataset with one 320x240 (WxH) camera is recorded first (`hilrec record --sim --root R
--episodes 20 --seed 0 --cameras front --size 320x240`, unless --root names one already there).
Then the whole check (every rule, every video frame decoded) runs with workers=1 and workers=2,
``repeats`` times each, in this process; the table gives the median wall time, frames/s (the
dataset's frames over the wall time), and the 1-minute load average before and after, since the
machine is shared. Both runs must report the same findings; the script says if they do not.

The peer is lerobot-doctor (PyPI), when it can be imported: installed, or unpacked from its wheel
into ``--doctor-path`` (it needs only pyarrow, av, rich, numpy and huggingface_hub, all in this
venv). Its ``check`` command runs as a subprocess and is timed end to end (the hilrec CLI is timed
the same way for comparison). It probes each video and decodes a sample of frames, not every
frame, so its frames/s is the dataset's frames over its wall time, not frames decoded.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

from _sim_dataset import record_sim_dataset

from hilrec.daemon.dataset.check.checker import check_dataset
from hilrec.daemon.dataset.format.reader import load_info


def time_in_process(root: Path, workers: int, repeats: int) -> tuple[float, float, float, list[dict]]:
    """(median wall s, load before, load after, findings of the last run)."""
    load_before = os.getloadavg()[0]
    walls = []
    findings: list[dict] = []
    for _ in range(repeats):
        started = time.perf_counter()
        report = check_dataset(root, workers=workers)
        walls.append(time.perf_counter() - started)
        findings = [asdict(f) for f in report.failures]
    return statistics.median(walls), load_before, os.getloadavg()[0], findings


def time_command(command: list[str], repeats: int, env: dict[str, str]) -> tuple[float, float, float, int]:
    load_before = os.getloadavg()[0]
    walls = []
    code = 0
    for _ in range(repeats):
        started = time.perf_counter()
        done = subprocess.run(command, check=False, capture_output=True, text=True, env=env)
        walls.append(time.perf_counter() - started)
        code = done.returncode
    return statistics.median(walls), load_before, os.getloadavg()[0], code


def doctor_env(doctor_path: Path | None) -> dict[str, str] | None:
    """The environment lerobot-doctor imports in, or None when it cannot be found."""
    env = dict(os.environ, HF_HUB_OFFLINE="1")  # a local dataset; never the hub
    if doctor_path is not None:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(doctor_path), env.get("PYTHONPATH")]))
        sys.path.insert(0, str(doctor_path))
    found = importlib.util.find_spec("lerobot_doctor") is not None
    if doctor_path is not None:
        sys.path.remove(str(doctor_path))
    return env if found else None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, help="dataset to check (recorded there if absent)")
    parser.add_argument("--episodes", type=int, default=20)
    parser.add_argument("--size", default="320x240", help="camera WxH (default 320x240)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--doctor-path", type=Path, help="directory holding an unpacked lerobot_doctor")
    parser.add_argument("--smoke", action="store_true", help="2 episodes at 64x48, one run each")
    args = parser.parse_args()
    if args.smoke:
        args.episodes, args.size, args.repeats = 2, "64x48", 1

    with tempfile.TemporaryDirectory(prefix="bench-check-") as tmp:
        root = args.root or Path(tmp) / "ds"
        if not (root / "meta" / "info.json").exists():
            record_sim_dataset(root, args.episodes, args.size)
        info = load_info(root)
        frames = int(info["total_frames"])
        print(
            f"dataset: {info['total_episodes']} episodes, {frames} frames, "
            f"cameras {[k for k, f in info['features'].items() if f['dtype'] == 'video']} at {args.size}; "
            f"{os.cpu_count()} cores"
        )
        rows = []
        results = {}
        for workers in (1, 2):
            wall, before, after, findings = time_in_process(root, workers, args.repeats)
            results[workers] = (wall, findings)
            rows.append((f"hilrec check, workers={workers} (in process)", wall, before, after, ""))
        same = results[1][1] == results[2][1]
        env = dict(os.environ)
        cli = [sys.executable, "-m", "hilrec.daemon.cli", "check", str(root), "--json"]
        wall, before, after, code = time_command([*cli, "--workers", "2"], args.repeats, env)
        rows.append(("hilrec check --workers 2 (CLI, with start-up)", wall, before, after, f"exit {code}"))
        doctor = doctor_env(args.doctor_path)
        if doctor is None:
            doctor_note = (
                "lerobot-doctor: not importable "
                "(pip download --no-deps lerobot-doctor, unzip the wheel, pass --doctor-path)"
            )
        else:
            command = [
                sys.executable,
                "-c",
                "import sys; from lerobot_doctor.cli import main; sys.exit(main())",
                "check",
                str(root),
                "--json",
            ]
            wall, before, after, code = time_command(command, args.repeats, doctor)
            version = subprocess.run(
                [sys.executable, "-c", "import lerobot_doctor; print(lerobot_doctor.__version__)"],
                check=False,
                capture_output=True,
                text=True,
                env=doctor,
            ).stdout.strip()
            rows.append(
                (f"lerobot-doctor {version} check (CLI, with start-up)", wall, before, after, f"exit {code}")
            )
            doctor_note = "lerobot-doctor decodes a sample of frames per video, hilrec check every frame"

        print()
        print("| run | wall s (median) | frames/s | load avg 1 min before -> after | note |")
        print("|---|---|---|---|---|")
        for name, wall, before, after, note in rows:
            print(f"| {name} | {wall:.2f} | {frames / wall:,.0f} | {before:.2f} -> {after:.2f} | {note} |")
        speedup = results[1][0] / results[2][0]
        print(
            f"\nworkers=2 / workers=1: {speedup:.2f}x; same findings: {same} ({len(results[1][1])} findings)"
        )
        print(doctor_note)
        print(json.dumps({"frames": frames, "speedup": round(speedup, 3), "same_findings": same}))
        return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
