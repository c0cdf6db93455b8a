"""``hilrec daemon --config FILE [--root DIR] [--resume]``: run the teleoperation and recording daemon.

The config is read and checked before anything else happens; a bad key stops the daemon with a
message naming it (exit status 2). See ``configs/*.toml`` and docs/protocol.md.
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
    parser.add_argument(
        "--resume",
        action="store_true",
        help="add episodes to the dataset already in the root (its features, fps and robot type must "
        "match this config); without it a non-empty root is refused",
    )
    parser.add_argument(
        "--no-verdicts",
        dest="verdicts",
        action="store_false",
        help="do not judge each saved episode in the idle-priority verdict worker",
    )
    parser.add_argument(
        "--no-verdict-gate",
        dest="verdict_gate",
        action="store_false",
        help="let the verdict worker run through the loop's ticks too (bench/bench_verdict.py compares)",
    )
    parser.add_argument(
        "--no-display",
        dest="display",
        action="store_false",
        help="do not start the config's [display] (hilrec collect --display runs its own)",
    )
    policy = parser.add_argument_group(
        "a policy driving the follower (each flag overrides its [policy] key; hilrec rollout passes them)"
    )
    policy.add_argument(
        "--policy", metavar="SPEC", help="a LeRobot pretrained directory, or module:function ([policy] spec)"
    )
    policy.add_argument("--takeover", metavar="MODE", help="key, leader, expert or off ([policy] takeover)")
    policy.add_argument("--policy-record", metavar="WHAT", help="all or corrections ([policy] record)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    # The daemon renders offscreen only (sim cameras, twin cameras); set before MuJoCo loads.
    os.environ.setdefault("MUJOCO_GL", "egl")
    os.environ.setdefault("PYOPENGL_PLATFORM", "egl")
    from hilrec.daemon.control.runtime import Daemon
    from hilrec.daemon.wire.policy_settings import with_policy
    from hilrec.daemon.wire.settings import load_settings

    settings = load_settings(args.config, root=args.root)
    settings = with_policy(settings, spec=args.policy, takeover=args.takeover, record=args.policy_record)
    daemon = Daemon(
        settings,
        resume=args.resume,
        verdicts=args.verdicts,
        verdict_gate=args.verdict_gate,
        display=args.display,
    )
    return daemon.run()
