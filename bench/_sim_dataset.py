"""The sim dataset the dataset-tool benchmarks work on: ``hilrec record --sim`` as a user runs it."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path


def record_sim_dataset(root: Path, episodes: int, size: str) -> None:
    """``episodes`` scripted episodes from seed 0 with one front camera of ``size`` (WxH)."""
    command = [
        sys.executable,
        "-m",
        "hilrec.daemon.cli",
        "record",
        "--sim",
        "--root",
        str(root),
        "--episodes",
        str(episodes),
        "--seed",
        "0",
        "--cameras",
        "front",
        "--size",
        size,
        "--no-progress",
    ]
    started = time.perf_counter()
    subprocess.run(command, check=True, env={**os.environ, "MUJOCO_GL": os.environ.get("MUJOCO_GL", "egl")})
    print(f"recorded {root} in {time.perf_counter() - started:.1f} s")
