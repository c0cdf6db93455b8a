"""``hilrec eval --policy P --seeds A:B``: a policy's closed-loop success on the twin, with a 95% CI.

The policy is a LeRobot pretrained policy directory or a Python entry point (``module:function``,
``module:Class``, ``path/to/file.py:name``; see :mod:`hilrec.daemon.tools.policies`). It is fed
the dataset's features only (``observation.state``, ``observation.images.<camera>``, ``task``),
never the cube's pose or the seed. An episode ends when the scene's success criterion holds or at
``--max-seconds``. The report gives the success rate with its 95% Wilson interval, the mean
episode length and why each failure failed (not grasped, dropped, not in the bin); ``--record
ROOT`` keeps every episode as a dataset that ``hilrec check --replay`` replays bit for bit.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from hilrec.daemon.config import flag_errors
from hilrec.daemon.errors import ConfigError
from hilrec.daemon.tools.cmd_coverage import parse_seeds
from hilrec.daemon.tools.cmd_export import parse_size

DEFAULT_CAMERAS = ("front",)
DEFAULT_SIZE = (640, 480)  # WxH, the recorder's default image
_FLAGS = {
    "seeds": "--seeds",
    "pushes": "--pushes",
    "episodes_per_seed": "--episodes-per-seed",
    "max_seconds": "--max-seconds",
    "cameras": "--cameras",
    "image_size": "--size",
    "policy": "--policy",
    "task": "--task",
    "root": "--record",
    "arms": "--arms",
}


def register(subparsers: Any) -> None:
    from hilrec.daemon.text import DEFAULT_TASK

    parser = subparsers.add_parser(
        "eval",
        help="closed-loop success of a policy on the twin, on held-out seeds, with pushes",
        description=__doc__.splitlines()[0],
    )
    parser.add_argument(
        "--policy",
        required=True,
        metavar="P",
        help="a LeRobot pretrained policy directory, or module:function / module:Class / file.py:name",
    )
    parser.add_argument(
        "--seeds", required=True, type=parse_seeds, metavar="A:B", help="evaluate seeds A..B-1 (held out)"
    )
    parser.add_argument("--pushes", type=float, default=0.0, metavar="RATE", help="random pushes per second")
    parser.add_argument("--episodes-per-seed", type=int, default=1, metavar="K", help="episodes of each seed")
    parser.add_argument(
        "--max-seconds", type=float, default=20.0, metavar="S", help="an episode's time limit"
    )
    parser.add_argument(
        "--cameras",
        default=None,
        help="comma-separated cameras fed to the policy, or 'none' (default: a LeRobot policy's "
        "own, else front)",
    )
    parser.add_argument(
        "--size",
        type=parse_size,
        default=None,
        metavar="WxH",
        help="camera image size (default: a LeRobot policy's own, else 640x480)",
    )
    parser.add_argument("--fps", type=int, default=25, help="frames per second (the training data's)")
    parser.add_argument(
        "--task",
        default=None,
        help=f"task text fed to the policy (default {DEFAULT_TASK!r}, or with --arms 2 the handover's)",
    )
    parser.add_argument(
        "--arms",
        type=int,
        choices=(1, 2),
        default=None,
        help="1: the one-arm scene; 2: the two-arm handover scene (default: as many arms as a "
        "LeRobot policy's state has, else 1)",
    )
    parser.add_argument(
        "--record", metavar="ROOT", type=Path, default=None, help="record every episode as a dataset here"
    )
    parser.add_argument("--video-codec", default="libsvtav1", help="with --record: the video encoder")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument(
        "--no-progress",
        dest="progress",
        action="store_false",
        help="no progress bar (default: one on stderr)",
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from hilrec.daemon.text import DEFAULT_TASK
    from hilrec.daemon.tools.evaluate import EvalConfig, evaluate
    from hilrec.daemon.tools.policies import load_policy
    from hilrec.sim.bimanual_scene import BIMANUAL_TASK, BimanualSceneConfig
    from hilrec.sim.cmd_record import parse_cameras
    from hilrec.sim.scene import SceneConfig

    with flag_errors(_FLAGS):
        policy = load_policy(args.policy)
        asked = None if args.cameras is None else parse_cameras(args.cameras)
        cameras, size = _inputs(asked, args.size, policy.wants.cameras, policy.wants.image_size)
        arms = _arms(args.arms, policy.wants.arms)
        config = EvalConfig(
            scene=SceneConfig() if arms == 1 else BimanualSceneConfig(),
            seeds=tuple(args.seeds),
            episodes_per_seed=args.episodes_per_seed,
            push_rate=args.pushes,
            max_seconds=args.max_seconds,
            fps=args.fps,
            cameras=cameras,
            image_size=size,
            task=args.task if args.task is not None else (DEFAULT_TASK if arms == 1 else BIMANUAL_TASK),
            record_root=args.record,
            video_codec=args.video_codec,
        )
        report = evaluate(config, policy, progress=args.progress)
    print(json.dumps(report.to_dict(), indent=2) if args.json else report.format_text(), file=sys.stdout)
    return 0


def _arms(asked: int | None, wanted: int | None) -> int:
    """The scene's arm count: as asked, else as the policy was trained; ConfigError on a clash."""
    if asked is not None and wanted is not None and asked != wanted:
        raise ConfigError("arms", f"the policy was trained on {wanted} arm(s), --arms asks for {asked}")
    return asked or wanted or 1


def _inputs(
    cameras: tuple[str, ...] | None,
    size_wh: tuple[int, int] | None,
    wanted_cameras: tuple[str, ...] | None,
    wanted_size: tuple[int, int] | None,
) -> tuple[tuple[str, ...], tuple[int, int]]:
    """The cameras and (height, width) fed: as asked, else as the policy wants, else the defaults;
    ConfigError where what is asked leaves out what the policy was trained on."""
    size = (size_wh[1], size_wh[0]) if size_wh is not None else None
    if wanted_cameras is not None:
        missing = [c for c in wanted_cameras if cameras is not None and c not in cameras]
        if missing:
            raise ConfigError("cameras", f"the policy was trained on camera {', '.join(missing)}; feed it")
        cameras = cameras if cameras is not None else wanted_cameras
    if wanted_size is not None and wanted_cameras:
        if size is not None and size != wanted_size:
            raise ConfigError(
                "image_size",
                f"the policy was trained on {wanted_size[1]}x{wanted_size[0]} images, "
                f"not {size[1]}x{size[0]}",
            )
        size = wanted_size
    if cameras is None:
        cameras = DEFAULT_CAMERAS
    if size is None:
        size = (DEFAULT_SIZE[1], DEFAULT_SIZE[0])
    return cameras, size
