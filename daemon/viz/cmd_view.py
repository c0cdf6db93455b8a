"""``hilrec view ROOT [--episode N] (--rrd OUT.rrd | --spawn | --serve)``: one recorded episode in
rerun (:mod:`hilrec.daemon.viz.view`), like LeRobot's ``lerobot-dataset-viz`` plus what only
hilrec records: the tick timing, the frame flags and, for hardware datasets, the twin's replay."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any


def register(subparsers: Any) -> None:
    from hilrec.daemon.cli import doc_summary
    from hilrec.daemon.viz.sink import add_output_flags

    parser: argparse.ArgumentParser = subparsers.add_parser(
        "view",
        help="show one recorded episode in rerun: video, joints, timing, flags, replay",
        description=doc_summary(__doc__),
    )
    parser.add_argument("root", type=Path, help="the dataset's root")
    parser.add_argument("--episode", type=int, help="the episode index (default: the first)")
    parser.add_argument(
        "--no-replay", action="store_true", help="hardware datasets: skip the replay on the twin"
    )
    add_output_flags(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from hilrec.daemon.viz.sink import check_output_flags, import_rerun, open_output
    from hilrec.daemon.viz.view import episode_choice, log_episode

    check_output_flags(args)
    rr = import_rerun()
    root = Path(args.root)
    index = episode_choice(root, args.episode)
    out = open_output(args, f"{root.name}-episode-{index:06d}", command="view")
    try:
        summary = log_episode(rr, out.recording, root, index, replay=not args.no_replay)
    finally:
        out.close()
    where = f" -> {out.rrd}" if out.rrd is not None else ""
    extra = f", replay {summary.replay_verdict}" if summary.replay_verdict else ""
    entities = len(summary.entities)
    print(f"hilrec view: episode {index}, {summary.frames} frames, {entities} entities{extra}{where}")
    return 0
