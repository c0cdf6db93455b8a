"""``hilrec edit SUBCOMMAND ROOT... [--out NEW]``: change a dataset, never losing it.

Without ``--out`` the dataset is changed in place, atomically: the result is written beside it,
checked by ``hilrec check`` (no error, no warning), then exchanged with it in one rename. With
``--out`` the result is written there (a new folder) and the source is left as it is.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from hilrec.daemon.cli import COMMANDS
from hilrec.daemon.dataset import LeRobotInfo
from hilrec.daemon.so101 import BodyMode
from hilrec.daemon.tools.episode_ranges import parse_episodes


def parse_fractions(text: str) -> list[float]:
    try:
        values = [float(part) for part in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected fractions such as 0.8,0.2, got {text!r}") from None
    return values


def _common(parser: argparse.ArgumentParser, *, out: bool = True) -> None:
    if out:
        parser.add_argument(
            "--out", type=Path, default=None, help="write the result to this new folder (default: in place)"
        )
    parser.add_argument(
        "--quick-check",
        action="store_true",
        help="check the result without decoding its videos (frames, timestamps and sizes are still checked)",
    )
    parser.add_argument(
        "--workers", type=int, default=1, help="processes that decode the videos for the check"
    )
    parser.add_argument("--json", action="store_true", help="print the report as JSON")


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "edit",
        help=COMMANDS["edit"][1],
        description=__doc__.splitlines()[0],
    )
    sub = parser.add_subparsers(dest="edit_command", metavar="SUBCOMMAND", parser_class=type(parser))
    sub.required = True

    p = sub.add_parser("recompute-stats", help="recompute every episode's stats and meta/stats.json")
    p.add_argument("root", type=Path)
    _common(p)

    p = sub.add_parser("delete-episodes", help="delete episodes, renumbering the rest")
    p.add_argument("root", type=Path)
    p.add_argument("--episodes", required=True, type=parse_episodes, help="e.g. 1,4-6")
    _common(p)

    _add_keep(sub)

    p = sub.add_parser("set-task", help="give episodes a new task string")
    p.add_argument("root", type=Path)
    p.add_argument("--episodes", required=True, type=parse_episodes, help="e.g. 1,4-6")
    p.add_argument("--task", required=True, help="the new task text")
    _common(p)

    p = sub.add_parser("remove-feature", help="drop a feature (a column or a camera)")
    p.add_argument("root", type=Path)
    p.add_argument("--feature", required=True, help="the feature key, e.g. observation.images.wrist")
    _common(p)

    p = sub.add_parser("merge", help="merge datasets (same fps, features, robot type) into --out")
    p.add_argument("roots", nargs="+", type=Path, metavar="ROOT")
    p.add_argument("--out", type=Path, required=True, help="the new folder")
    p.add_argument(
        "--lerobot",
        choices=[v.value for v in LeRobotInfo],
        default=None,
        help="spell the result's video info for this LeRobot's merge (default: as the first ROOT)",
    )
    _common(p, out=False)

    p = sub.add_parser("split", help="split into --out A B ... by --fractions or --episodes lists")
    p.add_argument("root", type=Path)
    p.add_argument("--out", type=Path, nargs="+", required=True, help="the new folders, one per part")
    p.add_argument("--fractions", type=parse_fractions, default=None, help="e.g. 0.8,0.2")
    p.add_argument(
        "--episodes", type=parse_episodes, nargs="+", default=None, help="one list per --out, e.g. 0-39 40-49"
    )
    _common(p, out=False)

    _add_convert_units(sub)

    p = sub.add_parser(
        "for-lerobot",
        help="spell the video info for LeRobot 0.4's or 0.6's merge (aggregate_datasets)",
    )
    p.add_argument("root", type=Path)
    p.add_argument(
        "--version",
        required=True,
        choices=[v.value for v in LeRobotInfo],
        help="the LeRobot whose datasets this one is to merge with",
    )
    _common(p)

    parser.set_defaults(func=run)


def _add_keep(sub: Any) -> None:
    p = sub.add_parser(
        "keep",
        help="keep only the successful episodes, those with a verdict, or a rollout's corrected ones",
    )
    p.add_argument("root", type=Path)
    p.add_argument("--success", action="store_true", help="keep episodes whose sidecar says success")
    p.add_argument(
        "--verdict", default=None, help="keep episodes with one of these verdicts (comma-separated)"
    )
    p.add_argument("--episodes", type=parse_episodes, default=None, help="keep only these, e.g. 0-9")
    p.add_argument(
        "--with-corrections",
        action="store_true",
        help="keep a rollout's episodes where a human took over (any frame with intervention true)",
    )
    p.add_argument(
        "--outcome",
        choices=("success", "failure"),
        help="keep a rollout's episodes of this outcome (the s / f key of hilrec rollout, or the twin's)",
    )
    _common(p)


def _add_convert_units(sub: Any) -> None:
    p = sub.add_parser(
        "convert-units",
        help="convert a RANGE_M100_100 dataset's observation.state and action to degrees",
    )
    p.add_argument("root", type=Path)
    p.add_argument("--to", required=True, choices=[BodyMode.DEGREES.value], help="the units to convert to")
    p.add_argument(
        "--calibration",
        required=True,
        type=Path,
        nargs="+",
        metavar="FILE",
        help="the follower's LeRobot calibration file (observation.state, and action by default); "
        "a two-arm dataset: one per arm, left first (<id>_left.json <id>_right.json)",
    )
    p.add_argument(
        "--leader-calibration",
        type=Path,
        nargs="+",
        metavar="FILE",
        default=None,
        help="the leader's calibration, for action (LeRobot records the leader's reading there); "
        "two arms: one per arm, left first",
    )
    _common(p)


def run(args: argparse.Namespace) -> int:
    from hilrec.daemon.tools import edit

    options = edit.Options(decode=not args.quick_check, workers=args.workers)
    command = args.edit_command
    if command == "recompute-stats":
        reports = [edit.recompute_stats(args.root, out=args.out, options=options)]
    elif command == "delete-episodes":
        reports = [edit.delete_episodes(args.root, args.episodes, out=args.out, options=options)]
    elif command == "keep":
        verdicts = [v.strip() for v in args.verdict.split(",")] if args.verdict else None
        if not (
            args.success or verdicts or args.episodes is not None or args.with_corrections or args.outcome
        ):
            from hilrec.daemon.errors import FlagError

            raise FlagError(
                "--success", "keep needs --success, --verdict, --episodes, --with-corrections or --outcome"
            )
        reports = [
            edit.keep_episodes(
                args.root,
                episodes=args.episodes,
                success=args.success,
                verdicts=verdicts,
                with_corrections=args.with_corrections,
                outcome=args.outcome,
                out=args.out,
                options=options,
            )
        ]
    elif command == "set-task":
        reports = [edit.set_task(args.root, args.episodes, args.task, out=args.out, options=options)]
    elif command == "remove-feature":
        reports = [edit.remove_feature(args.root, args.feature, out=args.out, options=options)]
    elif command == "convert-units":
        from hilrec.daemon.tools.edit_units import convert_units

        reports = [
            convert_units(
                args.root,
                to=BodyMode(args.to),
                calibration=args.calibration,
                leader_calibration=args.leader_calibration,
                out=args.out,
                options=options,
            )
        ]
    elif command == "merge":
        lerobot = LeRobotInfo(args.lerobot) if args.lerobot else None
        reports = [edit.merge(args.roots, args.out, lerobot=lerobot, options=options)]
    elif command == "for-lerobot":
        from hilrec.daemon.tools.edit_spelling import for_lerobot

        reports = [for_lerobot(args.root, LeRobotInfo(args.version), out=args.out, options=options)]
    else:
        reports = edit.split(
            args.root, args.out, fractions=args.fractions, lists=args.episodes, options=options
        )
    if args.json:
        print(json.dumps([r.to_dict() for r in reports], indent=2))
    else:
        for report in reports:
            print(report.format_text())
    return 0
