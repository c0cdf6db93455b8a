"""``hilrec replay``: the twin replay check (:mod:`hilrec.daemon.replay.cmd_replay`), and with
``--on-arm`` one episode played on the follower (:mod:`hilrec.daemon.control.arm_replay`).

The command lives here, in control, because ``--on-arm`` opens the follower as the daemon does
(:func:`hilrec.daemon.control.hardware.open_follower`, an emulated one started as a child in
emulated mode); without ``--on-arm`` it is the replay check, unchanged.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from pathlib import Path

from hilrec.daemon.errors import FlagError
from hilrec.daemon.replay import cmd_replay as twin_replay
from hilrec.daemon.scratch import scratch_folder

ON_ARM_EPILOG = """\
With --on-arm: `hilrec replay ROOT --on-arm --config DAEMON.toml --episode K` moves the
follower of the daemon config (hil: its port and calibration; emulated: an emulated follower
started for the run) slowly to episode K's first state, plays its recorded actions at the
dataset's fps (every goal through the calibrated range and max_relative_target), and reports
the measured joints against the recorded observation.state. --record ROOT2 saves the run as a
new episode of ROOT2. The torque is off when it ends, also after Ctrl-C.
  0  played to the end    2  refused (config, dataset, episode, port) or the arm lost    130  Ctrl-C
"""

# Flags of the twin check that mean nothing on the arm, and the reverse.
_TWIN_ONLY = (("episodes", "--episodes"), ("report", "--report"), ("ray", "--ray"))
_ARM_ONLY = (("episode", "--episode"), ("record", "--record"))


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = twin_replay.register(subparsers)
    parser.epilog = f"{parser.epilog}\n\n{ON_ARM_EPILOG}"
    arm = parser.add_argument_group("on the arm (--on-arm)")
    arm.add_argument(
        "--on-arm", action="store_true", help="play one episode on the follower of --config (a daemon config)"
    )
    arm.add_argument("--episode", type=int, metavar="K", help="the episode to play (with --on-arm)")
    arm.add_argument(
        "--record", type=Path, metavar="ROOT2", help="record the run as a new episode of the dataset ROOT2"
    )
    arm.add_argument(
        "--ramp-speed",
        type=float,
        default=30.0,
        metavar="UNITS_PER_S",
        help="fastest joint speed of the approach to the first state (degrees or 0..100 per second)",
    )
    arm.add_argument(
        "--start-tolerance",
        type=float,
        default=3.0,
        metavar="UNITS",
        help="every joint this close to the first state before the playback starts",
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if not args.on_arm:
        for attr, flag in _ARM_ONLY:
            if getattr(args, attr) is not None:
                raise FlagError(flag, "plays an episode on the arm: add --on-arm")
        return twin_replay.run(args)
    for attr, flag in _TWIN_ONLY:
        if getattr(args, attr) is not None:
            raise FlagError(flag, "belongs to the twin replay check; --on-arm plays one --episode")
    if args.workers != 1:
        raise FlagError("--workers", "belongs to the twin replay check; --on-arm plays one --episode")
    if args.config is None:
        raise FlagError("--config", "--on-arm needs the daemon config naming the follower (configs/hil.toml)")
    if args.episode is None:
        raise FlagError("--episode", "--on-arm plays one episode: give its index, e.g. --episode 0")
    if args.ramp_speed <= 0:
        raise FlagError("--ramp-speed", f"must be positive, got {args.ramp_speed}")
    if args.start_tolerance <= 0:
        raise FlagError("--start-tolerance", f"must be positive, got {args.start_tolerance}")
    if args.record is not None and args.record.resolve() == args.root.resolve():
        raise FlagError("--record", "must be another dataset than the one replayed")
    return _on_arm(args)


def _on_arm(args: argparse.Namespace) -> int:
    from hilrec.daemon.control.arm_replay import ArmReplayOptions, load_recorded, play_on_arm
    from hilrec.daemon.control.arm_replay_report import format_text, record_run, summarise
    from hilrec.daemon.control.hardware import (
        EMULATED_SCRATCH_PREFIX,
        dataset_fields,
        follower_port,
        open_follower,
        rig_timestep,
    )
    from hilrec.daemon.dataset import sigint_noted
    from hilrec.daemon.errors import ConfigError
    from hilrec.daemon.replay.settings import load_replay_settings
    from hilrec.daemon.wire.settings import load_settings

    settings = load_settings(args.config)
    if settings.mode == "sim":
        raise ConfigError("mode", f"{args.config}: --on-arm needs a follower arm: a hil or emulated config")
    episode = load_recorded(
        args.root,
        args.episode,
        arm_body=settings.follower.body_mode,
        units_flag=args.units,
        calibration_flag=args.calibration,
    )
    options = ArmReplayOptions(
        ramp_speed=args.ramp_speed,
        start_tolerance=args.start_tolerance,
        max_failed_ticks=settings.faults.max_failed_ticks,
        spin_s=settings.loop.spin_us / 1e6,
    )
    lag = load_replay_settings(None).lag
    # A Ctrl-C is only noted, from the start of the emulator to the torque off: the run ends at
    # a tick edge and the stack closes the arm (torque off) uninterrupted.
    with sigint_noted() as stop, contextlib.ExitStack() as stack:
        workdir = None
        if settings.mode == "emulated":
            workdir = scratch_folder(stack, EMULATED_SCRATCH_PREFIX)
        port, calibration, _ = follower_port(settings, stack, workdir, rig_timestep(settings))
        arm = open_follower(settings, stack, port, calibration)
        fields = dataset_fields(settings, arm, None)
        run = play_on_arm(arm, episode, options, stop)
    doc = summarise(episode, run, lag)
    doc["follower"] = {"mode": settings.mode, "port": port, "config": str(args.config)}
    if args.record is not None and run.played:
        doc["recorded_as"] = {
            "root": str(args.record),
            "episode_index": record_run(args.record, episode, run, doc, fields),
        }
    if args.json:
        json.dump(doc, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        print(format_text(doc))
        if "recorded_as" in doc:
            print(f"recorded as episode {doc['recorded_as']['episode_index']} of {args.record}")
        print("torque off")
    if run.fault is not None:
        return 2
    return 130 if run.interrupted else 0
