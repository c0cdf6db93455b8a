"""``hilrec replay ROOT``: replay-check episodes recorded on real or emulated hardware.

Each episode is replayed on the MuJoCo twin from its first recorded state with its recorded
actions, and compared with its recorded ``observation.state``: per joint RMS and max error, the
lag between action and response, gripper behaviour, clamped or saturated commands, and a verdict.
With --workers N the episodes replay in N processes, with --ray ADDRESS as tasks on a Ray
cluster, one task per episode; the result is the same either way.

Exit status (the worst verdict among the episodes checked):
  0  every episode consistent
  3  at least one lagging, none worse
  4  at least one diverged, none not replayable
  5  at least one not replayable (units, calibration, fps, columns...)
  2  the command itself was wrong (bad flag, unreadable config or dataset, unknown episode)
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from hilrec.daemon.replay.results import verdict_table


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> argparse.ArgumentParser:
    """Add the command's parser (``hilrec.daemon.control.cmd_replay`` adds ``--on-arm`` to it)."""
    parser = subparsers.add_parser(
        "replay",
        help="replay-check hardware episodes on the twin",
        description=__doc__.split("\n\n")[1],
        epilog="\n".join(__doc__.split("\n\n")[2:]),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("root", type=Path, help="the dataset's root directory")
    parser.add_argument(
        "--episodes",
        nargs="+",
        metavar="SPEC",
        help="episodes to check: indices and ranges, e.g. 0 3,5-7 (default: all)",
    )
    parser.add_argument(
        "--report",
        type=Path,
        metavar="DIR",
        help="write a PNG per episode, summary.md and report.json into DIR",
    )
    parser.add_argument(
        "--json", action="store_true", help="print the full result as JSON on stdout (and nothing else)"
    )
    parser.add_argument(
        "--units",
        choices=("degrees", "m100_100"),
        help="units of the body joints when the dataset has no hilrec metadata "
        "(the gripper is always 0..100)",
    )
    parser.add_argument(
        "--calibration",
        type=Path,
        metavar="FILE",
        help="the follower's LeRobot calibration JSON (needed with --units m100_100)",
    )
    parser.add_argument(
        "--config",
        type=Path,
        metavar="FILE",
        help="thresholds (default: configs/replay.toml); "
        "with --on-arm, the daemon config naming the follower",
    )
    parser.add_argument(
        "--workers",
        type=positive_int,
        default=1,
        metavar="N",
        help="processes that replay the episodes, one episode each at a time (default: %(default)s)",
    )
    parser.add_argument(
        "--ray",
        metavar="ADDRESS",
        help="replay the episodes as tasks on the Ray cluster at ADDRESS (e.g. 127.0.0.1:6379, "
        "or auto); every node must see ROOT at the same path",
    )
    parser.set_defaults(func=run)
    return parser


def run(args: argparse.Namespace) -> int:
    from hilrec.daemon.replay.check import parse_episode_spec, replay_dataset
    from hilrec.daemon.replay.settings import DEFAULT_CONFIG_PATH, load_replay_settings

    settings = load_replay_settings(args.config)
    source = str(args.config or DEFAULT_CONFIG_PATH)
    episodes = parse_episode_spec(args.episodes) if args.episodes else None
    check = replay_dataset(
        args.root,
        settings=settings,
        settings_source=source,
        episodes=episodes,
        units_flag=args.units,
        calibration_flag=args.calibration,
        workers=args.workers,
        ray_address=args.ray,
    )
    document = check.to_document()
    if args.report is not None:
        from hilrec.daemon.replay.report import write_report

        write_report(args.report, check, document)
    if args.json:
        json.dump(document, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        print(verdict_table(check.results))
        for r in check.results:
            for note in r.notes:
                print(f"  episode {r.episode_index}: {note}")
        counts = ", ".join(f"{n} {v}" for v, n in document["counts"].items() if n)
        frames = document["frames_replayed"]
        rate = frames / check.seconds if check.seconds > 0 else 0.0
        print(
            f"{len(check.results)} episode(s): {counts}; {frames} frames in "
            f"{check.seconds:.1f} s ({rate:.0f} frames/s); exit status {check.exit_status}"
        )
        if args.report is not None:
            print(f"report: {args.report / 'summary.md'}")
    return check.exit_status


def positive_int(text: str) -> int:
    """argparse type of ``--workers``: a whole number of at least 1."""
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value
