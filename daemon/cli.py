"""hilrec: record, check and replay SO-101 teleoperation datasets (LeRobot v3.0).

The one console command, ``hilrec``, and its sub-commands.

Each sub-command lives in its own module exposing ``register(subparsers)`` (adds its parser and
sets ``func``) and is imported lazily, so ``hilrec ctl status`` never pays for MuJoCo or PyAV.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from collections.abc import Sequence

from hilrec.daemon.errors import HilrecError

# sub-command name -> (module, one-line help). The module's register() builds the parser.
COMMANDS: dict[str, tuple[str, str]] = {
    "record": ("hilrec.sim.cmd_record", "record episodes in the MuJoCo twin with the scripted operator"),
    "check": ("hilrec.daemon.replay.cmd_check", "check a LeRobot v3.0 dataset (and replay it with --replay)"),
    "repair": (
        "hilrec.daemon.dataset.cmd_repair",
        "make a crashed dataset load again, keeping every saved episode",
    ),
    "render": ("hilrec.sim.cmd_render", "re-render the camera videos of sim episodes"),
    "replay": ("hilrec.daemon.replay.cmd_replay", "replay-check hardware episodes on the twin"),
    "calibrate": ("hilrec.drivers.cmd_calibrate", "calibrate an SO-101 arm (LeRobot's procedure and file)"),
    "emulate": (
        "hilrec.drivers.emulated.cmd_emulate",
        "emulate an SO-101 arm (six STS3215) on a pseudo-terminal",
    ),
    "daemon": ("hilrec.daemon.control.cmd_daemon", "run the teleoperation and recording daemon"),
    "ctl": ("hilrec.daemon.wire.cmd_ctl", "talk to a running daemon over ZeroMQ"),
}


def build_parser(argv: Sequence[str]) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="hilrec", description=__doc__.splitlines()[0])
    parser.add_argument("-v", "--verbose", action="store_true", help="log debug messages")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    wanted = next((a for a in argv if not a.startswith("-")), None)
    for name, (module_name, help_text) in COMMANDS.items():
        if name == wanted:
            module = importlib.import_module(module_name)
            module.register(sub)
        else:
            # A placeholder keeps `hilrec --help` complete without importing every command.
            sub.add_parser(name, help=help_text, add_help=False)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser(argv)
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    func = getattr(args, "func", None)
    if func is None:
        parser.error(f"'{args.command}' needs its arguments; see 'hilrec {args.command} --help'")
    try:
        return int(func(args) or 0)
    except HilrecError as exc:
        print(f"hilrec {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
