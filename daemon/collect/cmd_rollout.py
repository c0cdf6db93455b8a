"""``hilrec rollout --config FILE --policy SPEC --episodes N``: a bench session where a policy drives.

As ``hilrec collect``, but in each take the policy drives the follower (``--policy``: a LeRobot
pretrained directory with its processors, or module:function, as ``hilrec eval`` takes it). The
daemon is started from ``--config`` (sim, emulated or hil mode) with the policy, ``--takeover``
and ``--record`` given to it as its ``[policy]``; it runs the policy in a process of its own and
never waits for it. Each take is saved with who drove every frame (the ``intervention`` column),
the policy's proposals and timing beside it, and judged by the verdict worker, which also says
how often and where the human took over and whether the policy kept the rate.

Keys: collect's (→/n save, ←/r again, Esc/q finish), plus, during a take, space to take over
and space again to hand back (between takes space pauses, as in collect), and s / f to end the
take marked a success / a failure (the episode sidecar's ``success``). ``hilrec ctl takeover`` /
``handback`` and the ui page's buttons send the same requests. Without a terminal on stdin the
takes simply run their time.

--takeover: key (space, ctl, the page), leader (also the leader moved away from the follower by
[policy] leader_threshold), expert (the scripted hand, when the policy strays from it: sim and
emulated mode only), off (the policy keeps the arm). --record corrections keeps only the
correction windows, one episode each (LeRobot's record_autonomous=False).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any, Final

from hilrec.daemon.collect.cmd_collect import _non_negative_float, _positive_float, _positive_int
from hilrec.daemon.text import DEFAULT_TASK

TAKEOVERS: Final[tuple[str, ...]] = ("key", "leader", "expert", "off")
RECORDS: Final[tuple[str, ...]] = ("all", "corrections")
# Where the [policy] keys this command sets were typed, for errors that name them.
_FLAGS: Final[dict[str, str]] = {"spec": "--policy", "takeover": "--takeover", "record": "--record"}


def register(subparsers: Any) -> None:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "rollout",
        help="a bench session where a policy drives the follower and a person takes over (DAgger)",
        description=__doc__.split("\n\n")[1],
        epilog="\n\n".join(__doc__.split("\n\n")[2:]),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--config", type=Path, required=True, help="daemon TOML config (sim, emulated or hil)"
    )
    parser.add_argument(
        "--policy", required=True, metavar="SPEC", help="a LeRobot pretrained directory, or module:function"
    )
    parser.add_argument("--root", type=Path, help="dataset directory (overrides dataset.root in the config)")
    parser.add_argument("--episodes", type=_positive_int, required=True, metavar="N", help="takes to run")
    parser.add_argument(
        "--episode-time-s", type=_positive_float, default=60.0, metavar="T", help="length of a take"
    )
    parser.add_argument(
        "--reset-time-s", type=_non_negative_float, default=10.0, metavar="R", help="reset between takes"
    )
    parser.add_argument("--task", help=f"task text of every take (default {DEFAULT_TASK!r})")
    parser.add_argument("--resume", action="store_true", help="add to the dataset already in the root")
    parser.add_argument(
        "--takeover", choices=TAKEOVERS, default="key", help="what takes the arm from the policy"
    )
    parser.add_argument(
        "--record", choices=RECORDS, default="all", help="every frame, or only the correction windows"
    )
    parser.add_argument("--ui", action="store_true", help="also serve the bench's web page (hilrec ui)")
    parser.add_argument("--no-sounds", dest="sounds", action="store_false", help="no spoken prompts, no bell")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from hilrec.daemon.collect.cmd_collect import run_bench
    from hilrec.daemon.collect.launch import default_log_path
    from hilrec.daemon.collect.rollout_session import ROLLOUT_KEYS_HELP, RolloutSession
    from hilrec.daemon.collect.ui_child import UiChild
    from hilrec.daemon.errors import FlagError
    from hilrec.daemon.policy.record import RecordMode
    from hilrec.daemon.wire.policy_settings import with_policy
    from hilrec.daemon.wire.settings import load_settings

    spec = _check_spec(args.policy)
    tasks = _task(args)
    settings = load_settings(args.config, root=args.root)
    if args.takeover == "expert" and settings.mode == "hil":
        raise FlagError(
            "--takeover",
            "expert is the scripted hand of sim and emulated mode; in hil mode use key or leader",
        )
    settings = with_policy(settings, _FLAGS, spec=spec, takeover=args.takeover, record=args.record)
    record = RecordMode(args.record)
    flags = ["--policy", spec, "--takeover", args.takeover, "--policy-record", args.record]
    ui: UiChild | None = None
    if args.ui:
        ui = UiChild(args.config, default_log_path(Path(settings.dataset.root), "ui"), settings.ui.port)

    def session(**common: Any) -> RolloutSession:
        if ui is not None:
            ui.start(sys.stdout)  # once the daemon serves: the page's first status is a real one
        return RolloutSession(**common, tasks=tasks, record=record)

    try:
        return run_bench(
            args,
            "rollout",
            session,
            settings=settings,
            daemon_flags=flags,
            panel_options={"title": f"hilrec rollout: {args.policy}", "keys_help": ROLLOUT_KEYS_HELP},
        )
    finally:
        if ui is not None:
            ui.stop()


def _check_spec(spec: str) -> str:
    """The form of ``--policy`` at once (the daemon loads it, in its policy's process); a path
    made absolute, as the daemon may not share this working directory."""
    from hilrec.daemon.errors import FlagError

    if Path(spec).is_dir():
        return str(Path(spec).resolve())
    module, sep, attribute = spec.rpartition(":")
    if not sep or not module or not attribute:
        raise FlagError(
            "--policy",
            f"{spec!r} is neither a LeRobot pretrained policy directory nor an entry point module:function",
        )
    if module.endswith(".py"):
        if not Path(module).is_file():
            raise FlagError("--policy", f"{spec!r}: no file {module}")
        return f"{Path(module).resolve()}:{attribute}"
    return spec


def _task(args: argparse.Namespace) -> list[str]:
    from hilrec.daemon.errors import FlagError
    from hilrec.daemon.text import task_problem

    task = DEFAULT_TASK if args.task is None else args.task
    problem = task_problem(task)
    if problem is not None:
        raise FlagError("--task", f"{problem} (leave --task out for the default task)")
    return [task]
