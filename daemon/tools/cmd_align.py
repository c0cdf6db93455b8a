"""``hilrec align A B``: say whether two datasets line up column for column, and what to change."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from hilrec.daemon.so101 import BodyMode


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "align",
        help="check that two datasets (sim and real) line up column for column",
        description=__doc__.splitlines()[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("a", metavar="A", type=Path, help="a dataset root (e.g. the sim recording)")
    parser.add_argument("b", metavar="B", type=Path, help="the other dataset root (e.g. the real one)")
    modes = [m.value for m in BodyMode]
    parser.add_argument("--units-a", choices=modes, default=None, help="A's body-joint units, if known")
    parser.add_argument("--units-b", choices=modes, default=None, help="B's body-joint units, if known")
    for side in "ab":
        parser.add_argument(
            f"--calibration-{side}",
            type=Path,
            action="append",
            default=None,
            help=f"{side.upper()}'s arm calibration (LeRobot JSON); two arms: once per arm, left first",
        )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from hilrec.daemon.tools.align import align

    stated = tuple(BodyMode(u) if u else None for u in (args.units_a, args.units_b))
    result = align(
        args.a, args.b, units=(stated[0], stated[1]), calibrations=(args.calibration_a, args.calibration_b)
    )
    print(result.format_text())
    return 0 if result.aligned else 1
