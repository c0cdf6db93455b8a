"""``hilrec repair ROOT [--json]``: make a crashed dataset load, keeping every saved episode.

Exit codes (as ``mcap recover``): 0 nothing lost, 3 something was dropped (listed in the report),
2 the dataset could not be repaired at all.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from hilrec.daemon.dataset.repair import RepairReport, repair
from hilrec.daemon.errors import DatasetError


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "repair",
        help="make a crashed dataset load again, keeping every saved episode",
        description=__doc__.splitlines()[0],
    )
    parser.add_argument("root", type=Path, help="dataset root (the folder holding meta/)")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    try:
        report = repair(args.root)
    except DatasetError as exc:
        if args.json:
            print(json.dumps({"root": str(args.root), "error": str(exc), "exit_code": 2}))
        else:
            print(f"hilrec repair: cannot repair {args.root}: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(report.to_json(), indent=2))
    else:
        print(format_report(report))
    return report.exit_code


def format_report(report: RepairReport) -> str:
    lines = [f"repair {report.root}: {'rebuilt' if report.rebuilt else 'recovered'}"]
    lines.append(
        f"  kept {len(report.kept)} episode(s)" + (f": {_ranges(report.kept)}" if report.kept else "")
    )
    for item in report.dropped:
        lines.append(f"  DROPPED episode {item['episode']}: {item['reason']}")
    for old, new in sorted(report.renumbered.items()):
        lines.append(f"  episode {old} is now episode {new}")
    for action in report.actions:
        lines.append(f"  - {action}")
    lines.append("  nothing lost" if not report.dropped else f"  {len(report.dropped)} episode(s) dropped")
    return "\n".join(lines)


def _ranges(values: list[int]) -> str:
    parts = []
    start = prev = values[0]
    following: list[int | None] = [*values[1:], None]  # None closes the last range
    for value in following:
        if value is not None and value == prev + 1:
            prev = value
            continue
        parts.append(f"{start}" if start == prev else f"{start}-{prev}")
        if value is not None:
            start = prev = value
    return ", ".join(parts)
