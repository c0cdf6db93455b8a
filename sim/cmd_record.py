"""``hilrec record --sim``: record episodes in the MuJoCo twin with the scripted operator.

Ends with a finalized LeRobot v3.0 dataset at ``--root`` and a one-line summary (episodes,
successes, frames, image shape, time). Runs as fast as it can unless ``--realtime`` paces it to
the wall clock. ``--workers N`` records N seeds at once in N processes and ``--ray ADDRESS`` on a
Ray cluster (:mod:`hilrec.sim.record_workers`); the dataset's rows and sidecars are the same bytes
either way. Ctrl-C keeps the episodes saved so far, finalizes and exits 130.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

from hilrec.daemon.config import flag_errors
from hilrec.daemon.errors import ConfigError
from hilrec.daemon.policy.record import TakeoverMode
from hilrec.daemon.text import DEFAULT_TASK
from hilrec.sim.bimanual_scene import BIMANUAL_TASK, BimanualSceneConfig
from hilrec.sim.recorder import RecordConfig, record
from hilrec.sim.rollout import RolloutConfig
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
        "--arms",
        type=int,
        choices=(1, 2),
        default=1,
        help="1 (default): one arm picks the cube into the bin; 2: the handover scene, the left arm "
        "passes the cube to the right arm, which places it in the bin (LeRobot's bi_so_follower "
        "columns, 12 floats; cameras front, left_wrist, right_wrist)",
    )
    parser.add_argument(
        "--seed",
        type=int,
        default=None,
        help="seed of the first episode; episode k uses seed + k (default 0, or with --resume one "
        "past the highest seed already in the dataset, so no seed repeats)",
    )
    parser.add_argument(
        "--cameras", default="front", help="comma-separated cameras (front, wrist) or 'none' (default front)"
    )
    parser.add_argument(
        "--size",
        default="640x480",
        metavar="WxH",
        help="camera image size, width x height as video tools write it (default 640x480: "
        "480 rows of 640 pixels; 480x640 is portrait)",
    )
    parser.add_argument(
        "--pushes",
        type=float,
        default=0.0,
        metavar="RATE",
        help="random pushes on the cube or the arm, per second (default 0)",
    )
    parser.add_argument(
        "--task", default=None, help="task text of every frame (default: the scene's own task, per --arms)"
    )
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
    parser.add_argument(
        "--workers",
        type=int,
        default=1,
        metavar="N",
        help="record N seeds at once, one twin per process, videos encoded there (default 1)",
    )
    parser.add_argument(
        "--ray",
        default=None,
        metavar="ADDRESS",
        help="record the seeds as Ray tasks on the cluster at ADDRESS (host:port, or 'auto'); "
        "needs pip install hilrec[ray] on every node",
    )
    _add_policy_flags(parser)
    parser.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bar")
    parser.set_defaults(func=run)
    return parser


def _add_policy_flags(parser: argparse.ArgumentParser) -> None:
    """--policy and its takeover flags: a policy drives, the scripted operator is the expert."""
    parser.add_argument(
        "--policy",
        default=None,
        metavar="SPEC",
        help="a policy drives instead of the scripted operator: a LeRobot pretrained directory with "
        "its processors, or module:function, as hilrec eval takes it (asked in line, each frame)",
    )
    parser.add_argument(
        "--takeover",
        choices=("expert", "off"),
        default="expert",
        help="with --policy: the scripted operator takes over when the policy strays from it "
        "(expert, default), or never (off)",
    )
    parser.add_argument(
        "--takeover-threshold",
        type=float,
        default=RolloutConfig.threshold,
        metavar="UNITS",
        help=f"largest joint gap between the policy's goal and the expert's that counts as straying "
        f"(LeRobot units; default {RolloutConfig.threshold:g})",
    )
    parser.add_argument(
        "--takeover-ticks",
        type=int,
        default=RolloutConfig.ticks,
        metavar="K",
        help=f"frames in a row of straying before the expert takes over (default {RolloutConfig.ticks})",
    )
    parser.add_argument(
        "--max-relative-target",
        type=float,
        default=RolloutConfig.max_relative_target,
        metavar="UNITS",
        help="with --policy: the per-frame clamp of a policy goal around the observed joints "
        f"(default {RolloutConfig.max_relative_target:g})",
    )


def parse_cameras(text: str) -> tuple[str, ...]:
    text = text.strip()
    if text.lower() == "none":
        return ()
    names = tuple(name.strip() for name in text.split(",") if name.strip())
    if not names:
        raise ConfigError("cameras", "give camera names separated by commas, or 'none'")
    return names


def parse_size(text: str, key: str = "size") -> tuple[int, int]:
    """``WxH`` as video tools write it (``640x480``: 640 wide) -> the image shape (height, width)."""
    try:
        width, height = (int(part) for part in text.lower().split("x"))
    except ValueError:
        raise ConfigError(key, f"expected WxH (width x height) such as 640x480, got {text!r}") from None
    if height <= 0 or width <= 0:
        raise ConfigError(key, f"width and height must be positive, got {text!r}")
    return height, width


def describe_shape(shape: tuple[int, int]) -> str:
    """An image shape in both spellings, so neither can be misread."""
    height, width = shape
    return f"{width}x{height} (WxH), {height} rows of {width} pixels"


_FLAGS = {
    "push_rate": "--pushes",
    "image_size": "--size",
    "size": "--size",
    "scene": "--timestep",
    "realtime": "--realtime",
    "policy": "--policy",
    "takeover_ticks": "--takeover-ticks",
    "takeover_threshold": "--takeover-threshold",
    "max_relative_target": "--max-relative-target",
}


def run(args: argparse.Namespace) -> int:
    # Every value here came from a flag: an error names the flag, not a config key.
    with flag_errors(_FLAGS):
        if args.workers < 1:
            raise ConfigError("workers", f"must be at least 1, got {args.workers}")
        if args.ray is not None and args.workers != 1:
            raise ConfigError("ray", "Ray chooses how many tasks run at once; give --ray or --workers")
        rollout = _rollout(args)
        if rollout is not None and (args.workers != 1 or args.ray is not None):
            raise ConfigError("policy", "a policy records in this process; leave out --workers and --ray")
        # record() refuses a non-empty root without --resume, and a mismatching one with it.
        config = RecordConfig(
            root=args.root,
            episodes=args.episodes,
            seed=args.seed if args.seed is not None else _first_seed(args.root, args.resume),
            resume=args.resume,
            cameras=parse_cameras(args.cameras),
            image_size=parse_size(args.size),
            push_rate=args.pushes,
            task=args.task if args.task is not None else (DEFAULT_TASK if args.arms == 1 else BIMANUAL_TASK),
            fps=args.fps,
            # timestep None: the twin chooses the step for fps
            scene=(SceneConfig if args.arms == 1 else BimanualSceneConfig)(timestep=args.timestep),
            realtime=args.realtime,
            video_codec=args.video_codec,
            rollout=rollout,
        )
        if args.workers == 1 and args.ray is None:
            return _record_here(config, progress=args.progress)
        return _record_fanned(config, workers=args.workers, ray_address=args.ray, progress=args.progress)


def _rollout(args: argparse.Namespace) -> RolloutConfig | None:
    if args.policy is None:
        return None
    if args.takeover_ticks < 1:
        raise ConfigError("takeover_ticks", f"must be at least 1, got {args.takeover_ticks}")
    if not args.takeover_threshold > 0:
        raise ConfigError("takeover_threshold", f"must be positive, got {args.takeover_threshold}")
    if not args.max_relative_target > 0:
        raise ConfigError("max_relative_target", f"must be positive, got {args.max_relative_target}")
    return RolloutConfig(
        policy=args.policy,
        takeover=TakeoverMode(args.takeover),
        threshold=args.takeover_threshold,
        ticks=args.takeover_ticks,
        max_relative_target=args.max_relative_target,
    )


def _record_here(config: RecordConfig, *, progress: bool) -> int:
    before = _saved_episodes(config.root)
    try:
        summary = record(config, progress=progress)
    except KeyboardInterrupt:
        # record() has discarded the open episode and finalized the saved ones on its way out.
        kept = _saved_episodes(config.root) - before
        print(f"interrupted: {kept} episodes kept in {config.root}, finalized", file=sys.stderr)
        return 130
    print(f"{summary.line()}; images {_shape_of(config)}", file=sys.stdout)
    return 0


def _record_fanned(config: RecordConfig, *, workers: int, ray_address: str | None, progress: bool) -> int:
    from hilrec.sim.record_workers import record_many

    summary = record_many(config, workers=workers, ray_address=ray_address, progress=progress)
    if summary.interrupted:
        print(
            f"interrupted: {len(summary.episodes)} episodes kept in {config.root}, finalized; "
            f"not recorded: seeds {_seed_list(summary.not_recorded)}",
            file=sys.stderr,
        )
        return 130
    print(f"{summary.line()}; images {_shape_of(config)}", file=sys.stdout)
    if not summary.failed:
        return 0
    for seed, why in sorted(summary.failed.items()):
        print(f"seed {seed} not recorded: {why}", file=sys.stderr)
    print(
        f"{len(summary.failed)} seeds failed, the other episodes are saved in {config.root}; "
        f"record them again with: {_rerun_hint(config, sorted(summary.failed))}",
        file=sys.stderr,
    )
    return 1


def _shape_of(config: RecordConfig) -> str:
    return describe_shape(config.image_size) if config.cameras else "none (no camera)"


def _seed_list(seeds: list[int]) -> str:
    """``0, 3-7, 9``: runs of consecutive seeds as ranges."""
    if not seeds:
        return "none"
    runs: list[list[int]] = []
    for seed in sorted(seeds):
        if runs and seed == runs[-1][-1] + 1:
            runs[-1].append(seed)
        else:
            runs.append([seed])
    return ", ".join(str(r[0]) if len(r) == 1 else f"{r[0]}-{r[-1]}" for r in runs)


def _rerun_hint(config: RecordConfig, seeds: list[int]) -> str:
    """The command(s) that record ``seeds`` into the same dataset: one per run of consecutive
    seeds, with every flag that shapes an episode, so --resume finds the same world."""
    runs: list[list[int]] = []
    for seed in seeds:
        if runs and seed == runs[-1][-1] + 1:
            runs[-1].append(seed)
        else:
            runs.append([seed])
    height, width = config.image_size
    shared = [
        f"--cameras={','.join(config.cameras) or 'none'}",
        f"--size={width}x{height}",
        f"--pushes={config.push_rate!r}",  # repr: the rate itself, not a rounding of it
        f"--fps={config.fps}",
        f"--task={config.task}",
        f"--video-codec={config.video_codec}",
    ]
    if config.scene.timestep is not None:
        shared.append(f"--timestep={config.scene.timestep!r}")
    if config.scene.arms != 1:
        shared.append(f"--arms={config.scene.arms}")
    return "; ".join(
        shlex.join(
            [
                *("hilrec", "record", "--sim", f"--root={config.root}", "--resume"),
                *(f"--seed={run[0]}", f"--episodes={len(run)}", *shared),
            ]
        )
        for run in runs
    )


def _saved_episodes(root: Path) -> int:
    from hilrec.daemon.atomic import read_json
    from hilrec.daemon.dataset import INFO_PATH

    info = read_json(root / INFO_PATH, if_missing=None)
    return int(info.get("total_episodes", 0)) if isinstance(info, dict) else 0


def _first_seed(root: Path, resume: bool) -> int:
    """0 for a new dataset; with --resume, one past the highest seed its episodes were recorded
    with (so no seed repeats, even after a run that lost some seeds), or the number of episodes
    where no sidecar gives a seed."""
    if not resume:
        return 0
    from hilrec.daemon.atomic import read_json
    from hilrec.daemon.dataset import stored_episode_sidecars
    from hilrec.daemon.errors import HilrecError

    seeds = []
    for _, path in stored_episode_sidecars(root):
        if path.suffix != ".json":
            continue
        try:
            seed = read_json(path).get("sim", {}).get("seed")
        except (HilrecError, AttributeError):  # unreadable: check and repair say so, not this
            continue
        if isinstance(seed, int) and not isinstance(seed, bool):
            seeds.append(seed)
    return max(seeds) + 1 if seeds else _saved_episodes(root)
