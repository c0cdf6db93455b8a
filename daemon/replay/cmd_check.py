"""``hilrec check ROOT [--json] [--replay] [--strict] [--workers N]``: check a dataset.

Exit codes: 0 no errors (warnings allowed), 1 errors (with ``--strict`` warnings too), 2 the
command could not run. ``--workers`` processes decode the videos (default: one per core).

``--replay`` also replays the recorded actions on the MuJoCo twin (:mod:`hilrec.sim.replay`) and
merges its verdict into the report. The twin is imported only then, so a plain check never pays for
MuJoCo.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from hilrec.daemon.dataset.checker import check_dataset
from hilrec.daemon.errors import ReplayError

if TYPE_CHECKING:  # the twin imports MuJoCo; it is imported only when --replay asks for it
    from hilrec.sim.replay import ReplayReport

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
        "--replay", action="store_true", help="also replay the episodes on the twin and check they reproduce"
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
        type=_positive_int,
        default=os.cpu_count() or 1,
        metavar="N",
        help="processes that decode the videos (default: one per core, %(default)s here)",
    )
    parser.set_defaults(func=run)
    return parser


def run(args: argparse.Namespace) -> int:
    report = check_dataset(args.root, decode_video=args.decode, workers=args.workers, strict=args.strict)
    if args.replay:
        report.replay = _replay(args.root)
    print(report.to_json() if args.json else report.format_text(), file=sys.stdout)
    return EXIT_PASSED if report.passed else EXIT_FAILED


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _replay(root: Path) -> ReplayReport:
    try:
        from hilrec.sim.replay import replay_check
    except ImportError as exc:
        raise ReplayError(
            f"--replay needs hilrec.sim.replay.replay_check, which is not "
            f"available in this installation ({exc})"
        ) from exc
    return replay_check(root, episodes=None)
