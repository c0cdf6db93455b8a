"""``hilrec repair ROOT [--json]``: make a damaged or crashed dataset pass ``hilrec check`` again.

Every episode whose rows and frames can still be read is kept; the report has one line per
episode (runs of untouched episodes share a line): where its rows and frames came from, or why
it was dropped; its last line names the episodes kept, those whose video was encoded from their
spill (saved before their mp4 was finished) and those dropped. Exit codes (as ``mcap recover``,
plus one): 0 nothing lost, 3 episodes were dropped (listed), 2 the dataset could not be repaired
(it is left as it was, and the report says what ``hilrec check`` would still reject) or is
locked by another process (named with its pid), 4 not enough disk space (nothing was changed;
the report says how many bytes to free).

A take that was open when its writer was killed is kept up to its last checkpoint (about a
second behind the crash) and saved after the repair, marked ``ended_by: crash`` (the writer's
``crashed`` module). A sim episode whose video is missing or unreadable is re-rendered on the twin
from its start state and actions (:mod:`.regenerate`) instead of dropped. That is why this
module sits in ``hilrec.sim``: the dataset's rooms never import MuJoCo, and this imports it only
for a sim dataset that needs it.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from hilrec.daemon.dataset import (
    EXIT_DROPPED,
    EXIT_NOT_REPAIRED,
    EXIT_OK,
    format_report,
    load_info,
    repair_dataset,
    save_crashed,
    set_aside_crashed,
)
from hilrec.daemon.errors import CorruptDatasetError, DatasetError
from hilrec.sim.regenerate import sim_regenerator


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "repair",
        help="make a damaged or crashed dataset pass hilrec check, keeping every readable episode",
        description=__doc__.splitlines()[0],
    )
    parser.add_argument("root", type=Path, help="dataset root (the folder holding meta/)")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument(
        "--without-missing-video",
        action="store_true",
        help="keep the rows of episodes whose video of a camera is lost (and cannot be re-rendered: "
        "not a sim episode) by removing that camera from the dataset, instead of dropping them",
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    try:
        takes = set_aside_crashed(args.root) if (args.root / "meta/info.json").is_file() else []
        report = repair_dataset(
            args.root,
            regenerate=_regenerator(args.root),
            without_missing_video=args.without_missing_video,
        )
        saved = save_crashed(args.root, takes) if report.exit_code in (EXIT_OK, EXIT_DROPPED) else []
    except DatasetError as exc:
        if args.json:
            print(json.dumps({"root": str(args.root), "error": str(exc), "exit_code": EXIT_NOT_REPAIRED}))
        else:
            print(f"hilrec repair: cannot repair {args.root}: {exc}", file=sys.stderr)
        return EXIT_NOT_REPAIRED
    if args.json:
        print(json.dumps({**report.to_json(), "crashed_takes": saved}, indent=2))
    else:
        print(format_report(report))
        for line in saved:
            print(line)
    return report.exit_code


def _regenerator(root: Path) -> Any:
    try:
        info = load_info(root)
    except CorruptDatasetError:
        return None  # the repair rebuilds info.json first; no video is made again then
    return sim_regenerator(root, info)
