"""``hilrec record --sim``: record episodes in the MuJoCo twin with the scripted operator.

Ends with a finalized LeRobot v3.0 dataset at ``--root`` and a one-line summary (episodes,
successes, frames, time). Runs as fast as it can unless ``--realtime`` paces it to the wall clock.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from hilrec.daemon.config import flag_errors
from hilrec.daemon.errors import ConfigError
from hilrec.sim.recorder import DEFAULT_TASK, RecordConfig, record
from hilrec.sim.scene import SceneConfig


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "record",
        help="record episodes in the MuJoCo twin with the scripted operator",
        description=__doc__.splitlines()[0],
    )
    parser.add_argument(
        "--sim",
        action="store_true",
        required=True,
        help="record in the MuJoCo twin (hardware recording is 'hilrec daemon')",
    )
    parser.add_argument(
        "--root", type=Path, required=True, help="dataset directory: new, or an existing one with --resume"
    )
    parser.add_argument(
        "--resume",
        action="store_true",
        help="add the episodes to the dataset already in --root (its features, fps, robot type and "
        "world must match; without this flag a non-empty --root is refused)",
    )
    parser.add_argument("--episodes", type=int, required=True, help="number of episodes")
    parser.add_argument(
        "--seed",
        type=int,
        default=None,
        help="seed of the first episode; episode k uses seed + k (default 0, or with --resume the "
        "number of episodes already in the dataset, so no seed repeats)",
    )
    parser.add_argument(
        "--cameras", default="front", help="comma-separated cameras (front, wrist) or 'none' (default front)"
    )
    parser.add_argument(
        "--size", default="480x640", metavar="HxW", help="camera image size (default 480x640)"
    )
    parser.add_argument(
        "--pushes",
        type=float,
        default=0.0,
        metavar="RATE",
        help="random pushes on the cube or the arm, per second (default 0)",
    )
    parser.add_argument("--task", default=DEFAULT_TASK, help="task text of every frame")
    parser.add_argument(
        "--fps", type=int, default=25, help="frames per second (default 25; 30 lines up with LeRobot's)"
    )
    parser.add_argument(
        "--timestep",
        type=float,
        default=None,
        metavar="SECONDS",
        help="physics step; an --fps it does not divide into whole steps is refused (default: 5 ms "
        "where it divides the frame, else the largest step below that does, e.g. 1/210 s at 30 fps)",
    )
    parser.add_argument("--realtime", action="store_true", help="pace frames to the wall clock")
    parser.add_argument("--video-codec", default="libsvtav1", help="video encoder (default libsvtav1)")
    parser.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bar")
    parser.set_defaults(func=run)
    return parser


def parse_cameras(text: str) -> tuple[str, ...]:
    text = text.strip()
    if text.lower() == "none":
        return ()
    names = tuple(name.strip() for name in text.split(",") if name.strip())
    if not names:
        raise ConfigError("cameras", "give camera names separated by commas, or 'none'")
    return names


def parse_size(text: str, key: str = "size") -> tuple[int, int]:
    try:
        height, width = (int(part) for part in text.lower().split("x"))
    except ValueError:
        raise ConfigError(key, f"expected HxW such as 480x640, got {text!r}") from None
    if height <= 0 or width <= 0:
        raise ConfigError(key, f"height and width must be positive, got {text!r}")
    return height, width


_FLAGS = {"push_rate": "--pushes", "image_size": "--size", "scene": "--timestep", "realtime": "--realtime"}


def run(args: argparse.Namespace) -> int:
    # Every value here came from a flag: an error names the flag, not a config key.
    with flag_errors(_FLAGS):
        # record() refuses a non-empty root without --resume, and a mismatching one with it.
        config = RecordConfig(
            root=args.root,
            episodes=args.episodes,
            seed=args.seed if args.seed is not None else _first_seed(args.root, args.resume),
            resume=args.resume,
            cameras=parse_cameras(args.cameras),
            image_size=parse_size(args.size),
            push_rate=args.pushes,
            task=args.task,
            fps=args.fps,
            scene=SceneConfig(timestep=args.timestep),  # None: the twin chooses the step for fps
            realtime=args.realtime,
            video_codec=args.video_codec,
        )
        summary = record(config, progress=args.progress)
    print(summary.line(), file=sys.stdout)
    return 0


def _first_seed(root: Path, resume: bool) -> int:
    """0 for a new dataset; with --resume, the episodes it already has (so no seed repeats)."""
    if not resume:
        return 0
    from hilrec.daemon.atomic import read_json

    info = read_json(root / "meta" / "info.json", if_missing=None)
    return int(info.get("total_episodes", 0)) if isinstance(info, dict) else 0
