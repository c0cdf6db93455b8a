"""``hilrec replay ROOT``: replay-check episodes recorded on real or emulated hardware.

Each episode is replayed on the MuJoCo twin from its first recorded state with its recorded
actions, and compared with its recorded ``observation.state``: per joint RMS and max error, the
lag between action and response, gripper behaviour, clamped or saturated commands, and a verdict.

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

from hilrec.daemon.replay.results import EpisodeResult, Verdict


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
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
        "--config", type=Path, metavar="FILE", help="thresholds (default: configs/replay.toml)"
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from hilrec.daemon.replay.check import check_dataset, parse_episode_spec
    from hilrec.daemon.replay.settings import DEFAULT_CONFIG_PATH, load_replay_settings

    settings = load_replay_settings(args.config)
    source = str(args.config or DEFAULT_CONFIG_PATH)
    episodes = parse_episode_spec(args.episodes) if args.episodes else None
    check = check_dataset(
        args.root,
        settings=settings,
        settings_source=source,
        episodes=episodes,
        units_flag=args.units,
        calibration_flag=args.calibration,
    )
    document = check.to_document()
    if args.report is not None:
        from hilrec.daemon.replay.report import write_report

        write_report(args.report, check, document)
    if args.json:
        json.dump(document, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        print(_table(check.results, check.fps))
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


def _table(results: list[EpisodeResult], fps: int) -> str:
    rows = [("episode", "frames", "verdict", "lag", "worst joint", "reason")]
    for r in results:
        if r.verdict is Verdict.NOT_REPLAYABLE or r.lag is None:
            rows.append((str(r.episode_index), str(r.frames), r.verdict.value, "", "", r.reason))
            continue
        lag = "n/a" if r.lag.frames is None else f"{r.lag.frames:+.2f} fr {r.ms(r.lag.frames):+.0f} ms"
        wj = r.worst_joint()
        assert wj is not None
        rows.append(
            (
                str(r.episode_index),
                str(r.frames),
                r.verdict.value,
                lag,
                f"{wj.name} rms {wj.judged_rms_error:.2f} max {wj.judged_max_error:.2f}",
                r.reason,
            )
        )
    # The reason, last, is not padded: it is long, and nothing follows it.
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
    return "\n".join(
        "  ".join(cell.ljust(w) for cell, w in zip(row[:-1], widths, strict=True)) + "  " + row[-1]
        for row in rows
    )
