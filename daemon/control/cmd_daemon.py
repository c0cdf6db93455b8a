"""``hilrec daemon --config FILE [--root DIR]``: run the teleoperation and recording daemon.

The config is read and checked before anything else happens; a bad key stops the daemon with a
message naming it (exit status 2). See ``configs/*.toml`` and the README's "ZeroMQ protocol".
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any


def register(subparsers: Any) -> None:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "daemon",
        help="run the teleoperation and recording daemon",
        description="Run the hilrec daemon: a 25 Hz leader/follower loop recording LeRobot v3.0 "
        "episodes, driven over ZeroMQ (control REP, telemetry PUB, remote leader PULL).",
    )
    parser.add_argument(
        "--config",
        required=True,
        type=Path,
        help="TOML config (see configs/sim.toml, hil.toml, emulated.toml)",
    )
    parser.add_argument(
        "--root", type=Path, default=None, help="dataset directory (overrides dataset.root in the config)"
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    # The daemon renders offscreen only (sim cameras, twin cameras); set before MuJoCo loads.
    os.environ.setdefault("MUJOCO_GL", "egl")
    os.environ.setdefault("PYOPENGL_PLATFORM", "egl")
    from hilrec.daemon.control.runtime import Daemon
    from hilrec.daemon.control.settings import load_settings

    settings = load_settings(args.config, root=args.root)
    return Daemon(settings).run()
