"""``hilrec repair ROOT [--json]``: make a damaged or crashed dataset pass ``hilrec check`` again.

Every episode whose rows and frames can still be read is kept; the report has one line per
episode (runs of untouched episodes share a line): where its rows and frames came from, or why
it was dropped. Exit codes (as ``mcap recover``, plus one): 0 nothing lost, 3 episodes were
dropped (listed), 2 the dataset could not be repaired (it is left as it was, and the report says
what ``hilrec check`` would still reject) or is locked by another process (named with its pid),
4 not enough disk space (nothing was changed; the report says how many bytes to free).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from hilrec.daemon.dataset.repair import EXIT_NOT_REPAIRED, EpisodeOutcome, RepairReport, repair
from hilrec.daemon.errors import DatasetError


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "repair",
        help="make a damaged or crashed dataset pass hilrec check, keeping every readable episode",
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
            print(json.dumps({"root": str(args.root), "error": str(exc), "exit_code": EXIT_NOT_REPAIRED}))
        else:
            print(f"hilrec repair: cannot repair {args.root}: {exc}", file=sys.stderr)
        return EXIT_NOT_REPAIRED
    if args.json:
        print(json.dumps(report.to_json(), indent=2))
    else:
        print(format_report(report))
    return report.exit_code


def format_report(report: RepairReport) -> str:
    if report.no_space:
        how = "STOPPED (disk full)"
    elif report.unrepaired:
        how = "NOT repaired (left as it was)"
    else:
        how = "rebuilt" if report.rebuilt else "recovered"
    lines = [f"repair {report.root}: {how}"]
    lines += _table(report.episodes)
    for action in report.actions:
        lines.append(f"  - {action}")
    for problem in report.unrepaired:
        lines.append(f"  UNREPAIRED: {problem}")
    if report.no_space:
        lines.append(f"  NO SPACE: {report.no_space}")
    elif report.unrepaired:
        lines.append("  nothing was changed for these; hilrec check still fails")
    else:
        kept = f"kept {len(report.kept)} episode(s)" + (f" ({_ranges(report.kept)})" if report.kept else "")
        lost = f"{len(report.dropped)} episode(s) dropped" if report.dropped else "nothing lost"
        lines.append(f"  {kept}; {lost}")
    return "\n".join(lines)


def _table(outcomes: list[EpisodeOutcome]) -> list[str]:
    """One line per episode; consecutive kept episodes with the same sources share one."""
    if not outcomes:
        return []
    lines = [f"  {'episode':>9} {'now':>9} {'frames':>7}  outcome"]
    groups: list[list[EpisodeOutcome]] = []
    for outcome in outcomes:
        last = groups[-1][-1] if groups else None
        if (
            last is not None
            and outcome.kept
            and last.kept
            and outcome.episode == last.episode + 1
            and outcome.new_index == (last.new_index or 0) + 1
            and (outcome.rows, outcome.frames) == (last.rows, last.frames)
            and outcome.rows == "dataset"
        ):
            groups[-1].append(outcome)
        else:
            groups.append([outcome])
    for group in groups:
        first, end = group[0], group[-1]
        span = str(first.episode) if len(group) == 1 else f"{first.episode}-{end.episode}"
        now = (
            "-"
            if first.new_index is None
            else (str(first.new_index) if len(group) == 1 else f"{first.new_index}-{end.new_index}")
        )
        frames = sum(o.length or 0 for o in group) if all(o.length is not None for o in group) else "?"
        if first.kept:
            what = (
                "kept, unchanged"
                if first.rows == "dataset"
                else f"kept: rows from {first.rows}; frames from {first.frames}"
            )
        else:
            what = f"DROPPED: {first.reason}"
        lines.append(f"  {span:>9} {now:>9} {frames!s:>7}  {what}")
    return lines


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
