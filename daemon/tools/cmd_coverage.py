"""``hilrec coverage ROOT``: per-region counts, test coverage and the states farthest from the data."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from hilrec.daemon.errors import ConfigError


def parse_seeds(text: str) -> range:
    """``A:B``: the half-open seed range A, A+1, ..., B-1."""
    first, sep, last = text.partition(":")
    try:
        seeds = range(int(first), int(last))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a seed range A:B such as 100:120, got {text!r}") from None
    if not sep or len(seeds) == 0 or seeds.start < 0:
        raise argparse.ArgumentTypeError(f"expected A:B with 0 <= A < B, got {text!r}")
    return seeds


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "coverage",
        help="how much of the task a dataset covers (grid counts, test coverage, gaps)",
        description=__doc__.splitlines()[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("root", metavar="ROOT", type=Path, help="the dataset to measure")
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--against", metavar="TEST", type=Path, default=None, help="a test dataset")
    group.add_argument(
        "--against-seeds",
        metavar="A:B",
        type=parse_seeds,
        default=None,
        help="test states from scripted-operator roll-outs of seeds A..B-1 on the twin",
    )
    group.add_argument(
        "--by-source",
        action="store_true",
        help="a rollout's frames split by the intervention column: the human's as the data, the "
        "policy's as the test states",
    )
    parser.add_argument("--pushes", type=float, default=0.0, help="with --against-seeds: pushes per second")
    parser.add_argument(
        "--pair",
        default=None,
        help="the grid's two joints, e.g. shoulder_pan,elbow_flex (default: the two of largest variance)",
    )
    parser.add_argument("--bin", type=float, default=10.0, help="grid cell size in units (degrees, percent)")
    parser.add_argument("--radius", type=float, default=0.5, help="test coverage distance, in dataset std")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument("--plot", metavar="OUT.png", type=Path, default=None, help="write the one-page PNG")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from hilrec.daemon.tools.coverage import dataset_states, measure, plot, rollout_states

    if args.bin <= 0 or args.radius <= 0:
        raise ConfigError("--bin" if args.bin <= 0 else "--radius", "must be positive")
    test = None
    if args.by_source:
        from hilrec.daemon.tools.coverage_source import source_states

        data, test = source_states(args.root)
    else:
        data = dataset_states(args.root)
    if args.against is not None:
        test = dataset_states(args.against)
    elif args.against_seeds is not None:  # roll-outs of the dataset's own scene, one arm or two
        test = rollout_states(args.against_seeds, push_rate=args.pushes, arms=len(data.names) // 6)
    pair = args.pair.split(",") if args.pair else None
    result = measure(data, str(args.root), test=test, pair=pair, bin_size=args.bin, radius=args.radius)
    if args.plot is not None:
        plot(result, data, test, args.plot)
    if args.json:
        print(json.dumps({**result.to_dict(), "by_source": _by_source(data, test, args.by_source)}, indent=2))
    else:
        if args.by_source:
            print(
                f"{args.root} by source: the human's {len(data.values)} frames are the data, the "
                f"policy's {len(test.values) if test else 0} the test states"
            )
        print(result.format_text())
    if args.plot is not None and not args.json:
        print(f"  plot: {args.plot}")
    return 0


def _by_source(data: Any, test: Any, by_source: bool) -> dict[str, int] | None:
    if not by_source:
        return None
    return {"human_frames": len(data.values), "policy_frames": len(test.values)}
