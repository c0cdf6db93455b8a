"""``hilrec check ROOT [--json] [--replay] [--strict] [--workers N] [--ray ADDRESS]``: check a dataset.

Exit codes: 0 no errors (warnings allowed), 1 errors (with ``--strict`` warnings too), 2 the
command could not run. ``--workers`` processes decode the videos (default: one per core) and,
with ``--replay``, replay the episodes, one task per episode (default: as many as the dataset
repays, since a worker process costs a second or two to start: one per
:data:`~hilrec.daemon.replay.check_replay.FRAMES_PER_WORKER` frames, at most one per core).

``--replay`` also replays the episodes on the MuJoCo twin and merges its verdict into the report
(:mod:`hilrec.daemon.replay.check_replay`): the bit-exact replay for a sim dataset, the hardware
replay check (``hilrec replay``'s) for any other; the report says which ran, and a failed replay
fails the check. ``--ray ADDRESS`` runs the replay's per-episode tasks on a Ray cluster instead.
The twin is imported only then, so a plain check never pays for MuJoCo.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from hilrec.daemon.dataset import check_dataset
from hilrec.daemon.errors import FlagError
from hilrec.daemon.replay.check_replay import FRAMES_PER_WORKER
from hilrec.daemon.replay.cmd_replay import positive_int

EXIT_PASSED = 0
EXIT_FAILED = 1


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "check",
        help="check a LeRobot v3.0 dataset (and replay it with --replay)",
        description=__doc__.splitlines()[0],
    )
    parser.add_argument("root", type=Path, metavar="ROOT", help="dataset directory (holds meta/)")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument(
        "--replay",
        action="store_true",
        help="also replay the episodes on the twin: bit for bit for a sim dataset, with "
        "hilrec replay's hardware check for any other",
    )
    parser.add_argument(
        "--no-decode",
        dest="decode",
        action="store_false",
        help="demux videos only: skip decoding the frames the image stats sample",
    )
    parser.add_argument("--strict", action="store_true", help="warnings fail the check too (exit 1)")
    parser.add_argument(
        "--workers",
        type=positive_int,
        metavar="N",
        help="processes that decode the videos and, with --replay, replay the episodes "
        f"(default: one per core, {os.cpu_count() or 1} here, for the videos; for the replay as "
        f"many as the dataset repays, one per {FRAMES_PER_WORKER:,} frames, at most one per core)",
    )
    parser.add_argument(
        "--ray",
        metavar="ADDRESS",
        help="with --replay: replay the episodes as tasks on the Ray cluster at ADDRESS "
        "(e.g. 127.0.0.1:6379, or auto); every node must see ROOT at the same path",
    )
    parser.add_argument(
        "--units",
        choices=("degrees", "m100_100"),
        help="with --replay, for a hardware dataset without hilrec metadata: the body joints' units",
    )
    parser.add_argument(
        "--calibration",
        type=Path,
        metavar="FILE",
        help="with --replay: the follower's LeRobot calibration JSON (needed with --units m100_100)",
    )
    parser.add_argument(
        "--config",
        type=Path,
        metavar="FILE",
        help="with --replay: the hardware replay check's thresholds (default: configs/replay.toml)",
    )
    parser.set_defaults(func=run)
    return parser


def run(args: argparse.Namespace) -> int:
    replay_only = [
        f
        for f, v in (
            ("--ray", args.ray),
            ("--units", args.units),
            ("--calibration", args.calibration),
            ("--config", args.config),
        )
        if v
    ]
    if replay_only and not args.replay:
        raise FlagError(replay_only[0], "it applies to the replay: add --replay")
    video_workers = args.workers or os.cpu_count() or 1
    report = check_dataset(args.root, decode_video=args.decode, workers=video_workers, strict=args.strict)
    if args.replay:
        from hilrec.daemon.replay.check_replay import replay_for_check

        report.replay = replay_for_check(
            args.root,
            workers=args.workers,
            ray_address=args.ray,
            strict=args.strict,
            units_flag=args.units,
            calibration_flag=args.calibration,
            config=args.config,
        )
    print(report.to_json() if args.json else report.format_text(), file=sys.stdout)
    return EXIT_PASSED if report.passed else EXIT_FAILED
