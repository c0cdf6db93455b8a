"""``hilrec export ROOT --format robomimic --out FILE``: the dataset in another trainer's layout."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from hilrec.daemon.errors import ConfigError
from hilrec.daemon.tools.episode_ranges import parse_episodes

FORMATS = ("robomimic",)


def parse_size(text: str) -> tuple[int, int]:
    """``WxH`` (as every video tool writes it) -> (width, height)."""
    try:
        width, height = (int(part) for part in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected WIDTHxHEIGHT such as 640x480, got {text!r}") from None
    if width <= 0 or height <= 0:
        raise argparse.ArgumentTypeError(f"width and height must be positive, got {text!r}")
    return width, height


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "export",
        help="write a dataset in another trainer's layout (robomimic HDF5)",
        description=__doc__.splitlines()[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("root", metavar="ROOT", type=Path, help="the LeRobot v3.0 dataset")
    parser.add_argument("--format", required=True, choices=FORMATS, help="the layout to write")
    parser.add_argument("--out", required=True, type=Path, help="the file to write (never left partial)")
    parser.add_argument(
        "--size", type=parse_size, default=None, help="resize images to WxH (default: as recorded)"
    )
    parser.add_argument("--episodes", type=parse_episodes, default=None, help="only these, e.g. 0,3-5")
    parser.add_argument("--force", action="store_true", help="replace an existing --out")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from hilrec.daemon.tools.export import export_robomimic

    if args.format != "robomimic":  # argparse's choices already refused it; say so if that changes
        raise ConfigError("--format", f"unknown format {args.format!r}")
    report = export_robomimic(
        args.root, args.out, episodes=args.episodes, size=args.size, overwrite=args.force
    )
    print(report.format_text())
    return 0
